"""The example sink: a file of JSON lines, once per change id.

The same sink as examples/plugins/go-sink (package filesink), in Python: it
appends each change to a file as a JSON line ({"id", "subject", "headers",
"payload" in base64}, the Go example's format) and keeps every change once,
by id, so it declares that it resumes (exactly once across crashes of the
bridge and of itself).

Its config block (bridge.yaml: sinks.<name>.config.config):

    path: /var/lib/cdc/changes.jsonl   # required: the file, created if missing
    pid_file: /run/cdc-sink.pid        # optional: written with the process id
    dedupe: true                       # default; false writes a change again when sent again

The cursor is the number of lines the file held after a Write; Delivered
returns the ids of the producer's lines after it. A line cut short by a
crash is dropped when the file is opened again. Break and Heal (for
`bridge plugin test`) create and remove "<path>.broken", which makes Connect
and Write fail until it is gone.

One lock orders every RPC: gRPC runs them on a thread pool, and the contract
asks that Delivered answer after a Write still under way (one whose caller
gave up) has finished.
"""

import base64
import json
import os
import threading

import grpc

import sink_pb2 as pb
import sink_pb2_grpc

# The minor of bridge.plugin.v1 this plugin was written against.
CONTRACT_MINOR = 1

KNOWN_KEYS = "path, pid_file, dedupe"


def _read_lines(path):
    """The whole lines of path as dicts, and their size in bytes."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1
    out = []
    for n, raw in enumerate(data[:end].splitlines(), 1):
        try:
            out.append(json.loads(raw))
        except ValueError as e:
            raise OSError("reading %s line %d: %s" % (path, n, e)) from e
    return out, end


def _error(message, permanent=False, not_connected=False):
    return pb.Error(message=message, permanent=permanent, not_connected=not_connected)


class FileSink(sink_pb2_grpc.SinkServicer, sink_pb2_grpc.ConformanceServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.path = ""
        self.pid_file = ""
        self.dedupe = True
        self.f = None
        self.ids = set()
        self.lines = 0

    # Sink

    def Describe(self, request, context):
        return pb.DescribeResponse(
            contract_minor=CONTRACT_MINOR,
            name="python-sink",
            version="0.1.0",
            doc="appends each change to a file as a JSON line, once per id (example, Python)",
            resumes=True,
            dedupes=self.dedupe,
        )

    def Configure(self, request, context):
        resp = pb.ConfigureResponse()
        try:
            raw = json.loads(request.config_json or b"{}")
        except ValueError as e:
            resp.field_errors.add(key="", message="not a JSON object: %s" % e)
            return resp
        if not isinstance(raw, dict):
            resp.field_errors.add(key="", message="not a JSON object")
            return resp
        path, pid_file, dedupe = "", "", True
        for k, v in sorted(raw.items()):
            if k == "dedupe":
                if not isinstance(v, bool):
                    resp.field_errors.add(key=k, message="expected true or false, got %s" % type(v).__name__)
                dedupe = v is not False
            elif k not in ("path", "pid_file"):
                resp.field_errors.add(key=k, message="unknown key (known: %s)" % KNOWN_KEYS)
            elif not isinstance(v, str):
                resp.field_errors.add(key=k, message="expected a string, got %s" % type(v).__name__)
            elif k == "path":
                path = v
            else:
                pid_file = v
        if not path and not resp.field_errors:
            resp.field_errors.add(key="path", message="must be set")
        if resp.field_errors:
            return resp
        with self.lock:
            self.path, self.pid_file, self.dedupe = path, pid_file, dedupe
        if pid_file:
            with open(pid_file, "w") as f:
                f.write("%d\n" % os.getpid())
        return resp

    def _broken(self):
        return os.path.exists(self.path + ".broken")

    def Connect(self, request, context):
        with self.lock:
            try:
                self._open()
            except OSError as e:
                # A missing directory will not appear by retrying: permanent.
                missing = not os.path.isdir(os.path.dirname(os.path.abspath(self.path)))
                return pb.ConnectResponse(error=_error(str(e), permanent=missing))
            except RuntimeError as e:
                return pb.ConnectResponse(error=_error(str(e)))
        return pb.ConnectResponse()

    def _open(self):
        if not self.path:
            raise RuntimeError("not configured")
        if self._broken():
            raise RuntimeError("%s is broken (%s.broken exists)" % (self.path, self.path))
        if self.f is not None:
            return
        lines, size = _read_lines(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)  # a line cut short by a crash
            os.lseek(fd, size, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        self.f = fd
        self.ids = {l["id"] for l in lines}
        self.lines = len(lines)

    def Write(self, request, context):
        with self.lock:
            if self.f is None:
                return pb.WriteResponse(error=_error("not connected", not_connected=True))
            if self._broken():
                return pb.WriteResponse(error=_error(self.path + " is broken"))
            buf = []
            added = []
            for c in request.changes:
                if self.dedupe and c.id in self.ids:
                    continue
                line = {"id": c.id, "subject": c.subject}
                if c.headers:
                    line["headers"] = dict(c.headers)
                line["payload"] = base64.b64encode(c.payload).decode("ascii")
                buf.append(json.dumps(line, separators=(",", ":")))
                buf.append("\n")
                added.append(c.id)
            if added:
                data = "".join(buf).encode("utf-8")
                try:
                    while data:
                        n = os.write(self.f, data)
                        data = data[n:]
                    os.fsync(self.f)
                except OSError as e:
                    return pb.WriteResponse(error=_error(str(e), not_connected=True))
                self.ids.update(added)
                self.lines += len(added)
            return pb.WriteResponse(cursor=str(self.lines))

    def Delivered(self, request, context):
        with self.lock:
            start = 0
            if request.cursor:
                try:
                    start = int(request.cursor)
                except ValueError:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "cursor %r is not a line count" % request.cursor)
            lines, _ = _read_lines(self.path)
            prefix = request.producer + ":"
            return pb.DeliveredResponse(ids=[l["id"] for l in lines[start:] if l["id"].startswith(prefix)])

    def Close(self, request, context):
        with self.lock:
            if self.f is not None:
                fd, self.f = self.f, None
                try:
                    os.close(fd)
                except OSError as e:
                    return pb.CloseResponse(error=_error(str(e)))
        return pb.CloseResponse()

    # Conformance

    def Read(self, request, context):
        with self.lock:
            lines, _ = _read_lines(self.path)
        resp = pb.ReadResponse()
        for l in lines:
            r = resp.records.add(id=l["id"], subject=l.get("subject", ""))
            if l.get("payload"):
                r.payload = base64.b64decode(l["payload"])
            for k, v in (l.get("headers") or {}).items():
                r.headers[k] = v
        return resp

    def Break(self, request, context):
        with open(self.path + ".broken", "w"):
            pass
        return pb.BreakResponse()

    def Heal(self, request, context):
        try:
            os.remove(self.path + ".broken")
        except FileNotFoundError:
            pass
        return pb.HealResponse()


def register(server, sink):
    sink_pb2_grpc.add_SinkServicer_to_server(sink, server)
    sink_pb2_grpc.add_ConformanceServicer_to_server(sink, server)
