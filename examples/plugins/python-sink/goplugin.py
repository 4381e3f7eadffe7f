"""go-plugin's side of a plugin, for a plugin written in Python.

hashicorp/go-plugin (which the bridge uses to run plugins) speaks to a
plugin in any language through gRPC once the plugin has

1. checked the magic cookie in its environment (a plugin refuses to run
   when a person starts it by hand),
2. agreed a protocol version: the bridge lists the majors it speaks in
   PLUGIN_PROTOCOL_VERSIONS; the plugin answers with the one it serves,
3. served gRPC's health service, with "plugin" SERVING,
4. printed the handshake line on stdout:
   ``1|<app protocol version>|unix|<socket path>|grpc``, the socket in the
   directory PLUGIN_UNIX_SOCKET_DIR names (the bridge makes one per
   process, mode 0700).

serve() does those four steps around the servicers a plugin registers.
"""

import os
import sys
import tempfile
import threading
from concurrent import futures

import grpc

import health_pb2
import health_pb2_grpc

# go-plugin's own protocol version (the first field of the handshake).
CORE_PROTOCOL_VERSION = 1


class _Health(health_pb2_grpc.HealthServicer):
    """Answers SERVING for "" (the server) and "plugin" (go-plugin's check)."""

    def Check(self, request, context):
        if request.service not in ("", "plugin"):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service " + request.service)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


def _refuse(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
    sys.exit(1)


def serve(register, *, cookie_key, cookie_value, version, workers=4):
    """Serve until the process is stopped.

    register(server) adds the plugin's servicers to the grpc.Server.
    cookie_key and cookie_value are the application's magic cookie; version
    is the application protocol version (the contract's major) this plugin
    serves.
    """
    if os.environ.get(cookie_key) != cookie_value:
        _refuse(
            "This is a plugin of the bridge (bridge.plugin.v%d): it is started by the bridge, "
            "not by hand (sink type plugin, or `bridge plugin test <this file>`)." % version
        )
    offered = os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "")
    if offered and str(version) not in [v.strip() for v in offered.split(",")]:
        _refuse(
            "this plugin serves version %d of the plugin contract, the bridge offers %s: "
            "use a plugin built for one of those" % (version, offered)
        )

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        # The bridge sends whole batches: no 4 MiB limit on what it sends.
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(_Health(), server)
    register(server)
    # A unix socket in the directory the bridge made for this process
    # (mode 0700): only the bridge's user reaches it, where a port on
    # loopback would let every process of the machine read and write.
    sock_dir = os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or tempfile.mkdtemp(prefix="bridge-plugin-")
    sock = os.path.join(sock_dir, "plugin.sock")
    if server.add_insecure_port("unix:" + sock) == 0:
        _refuse("cannot listen on %s" % sock)
    server.start()
    sys.stdout.write("%d|%d|unix|%s|grpc\n" % (CORE_PROTOCOL_VERSION, version, sock))
    sys.stdout.flush()
    # The bridge stops the process (SIGKILL, or its death: PR_SET_PDEATHSIG)
    # after its Close RPC; nothing to wait for but that.
    threading.Event().wait()
