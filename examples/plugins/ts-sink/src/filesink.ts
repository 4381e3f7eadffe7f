// The example sink: a file of JSON lines, once per change id.
//
// The same sink as examples/plugins/go-sink (package filesink), in
// TypeScript: it appends each change to a file as a JSON line ({"id",
// "subject", "headers", "payload" in base64}, the Go example's format) and
// keeps every change once, by id, so it declares that it resumes (exactly
// once across crashes of the bridge and of itself).
//
// Its config block (bridge.yaml: sinks.<name>.config.config):
//
//   path: /var/lib/cdc/changes.jsonl   # required: the file, created if missing
//   pid_file: /run/cdc-sink.pid        # optional: written with the process id
//   dedupe: true                       # default; false writes a change again when sent again
//
// The cursor is the number of lines the file held after a Write; Delivered
// returns the ids of the producer's lines after it. A line cut short by a
// crash is dropped when the file is opened again. Break and Heal (for
// `bridge plugin test`) create and remove "<path>.broken", which makes
// Connect and Write fail until it is gone.
//
// Every handler is synchronous (fs.*Sync): Node runs one at a time, whole,
// so a Delivered answers after a Write still under way (one whose caller
// gave up) has finished, as the contract asks.

import * as fs from "node:fs";
import * as path from "node:path";

import * as grpc from "@grpc/grpc-js";

import { StatusError, lookup, unary } from "./goplugin";

// The minor of bridge.plugin.v1 this plugin was written against.
const CONTRACT_MINOR = 1;

// The messages of sink.proto this plugin uses, as @grpc/proto-loader hands
// them over (see LOADER_OPTIONS: 64-bit integers are strings).
export interface PluginError {
  message: string;
  permanent?: boolean;
  not_connected?: boolean;
}
interface FieldError {
  key: string;
  message: string;
}
interface Change {
  id: string;
  subject: string;
  payload: Buffer;
  headers: Record<string, string>;
  producer: string;
  commit_lsn: string;
  seq: number;
  schema: string;
  table: string;
  op: string;
  commit_time_us: string;
}
interface Record_ {
  id: string;
  subject: string;
  payload: Buffer;
  headers: Record<string, string>;
}

// Line is one change in the file.
interface Line {
  id: string;
  subject: string;
  headers?: Record<string, string>;
  payload: string | null;
}

// readLines returns the whole lines of file and their size in bytes.
function readLines(file: string): { lines: Line[]; size: number } {
  let data: Buffer;
  try {
    data = fs.readFileSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") {
      return { lines: [], size: 0 };
    }
    throw e;
  }
  const size = data.lastIndexOf(0x0a) + 1;
  const lines: Line[] = [];
  let start = 0;
  while (start < size) {
    const end = data.indexOf(0x0a, start);
    try {
      lines.push(JSON.parse(data.toString("utf8", start, end)) as Line);
    } catch (e) {
      throw new Error(`reading ${file} line ${lines.length + 1}: ${(e as Error).message}`);
    }
    start = end + 1;
  }
  return { lines, size };
}

export class FileSink {
  private file = "";
  private pidFile = "";
  private dedupe = true;
  private fd: number | null = null;
  private ids = new Set<string>();
  private count = 0;

  describe() {
    return {
      contract_minor: CONTRACT_MINOR,
      name: "ts-sink",
      version: "0.1.0",
      doc: "appends each change to a file as a JSON line, once per id (example, TypeScript)",
      resumes: true,
      dedupes: this.dedupe,
    };
  }

  configure(req: { config_json: Buffer }): { field_errors: FieldError[] } {
    const errs: FieldError[] = [];
    let raw: unknown;
    try {
      raw = JSON.parse(req.config_json.length ? req.config_json.toString("utf8") : "{}");
    } catch (e) {
      return { field_errors: [{ key: "", message: `not a JSON object: ${(e as Error).message}` }] };
    }
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
      return { field_errors: [{ key: "", message: "not a JSON object" }] };
    }
    let file = "";
    let pidFile = "";
    let dedupe = true;
    for (const [k, v] of Object.entries(raw as Record<string, unknown>).sort()) {
      if (k === "dedupe") {
        if (typeof v !== "boolean") {
          errs.push({ key: k, message: `expected true or false, got ${typeof v}` });
        }
        dedupe = v !== false;
      } else if (k !== "path" && k !== "pid_file") {
        errs.push({ key: k, message: "unknown key (known: path, pid_file, dedupe)" });
      } else if (typeof v !== "string") {
        errs.push({ key: k, message: `expected a string, got ${typeof v}` });
      } else if (k === "path") {
        file = v;
      } else {
        pidFile = v;
      }
    }
    if (file === "" && errs.length === 0) {
      errs.push({ key: "path", message: "must be set" });
    }
    if (errs.length === 0) {
      this.file = file;
      this.pidFile = pidFile;
      this.dedupe = dedupe;
      if (pidFile !== "") {
        fs.writeFileSync(pidFile, `${process.pid}\n`);
      }
    }
    return { field_errors: errs };
  }

  private broken(): boolean {
    return fs.existsSync(this.file + ".broken");
  }

  connect(): { error: PluginError | null } {
    if (this.file === "") {
      return { error: { message: "not configured" } };
    }
    if (this.broken()) {
      return { error: { message: `${this.file} is broken (${this.file}.broken exists)` } };
    }
    if (this.fd !== null) {
      return { error: null };
    }
    try {
      const { lines, size } = readLines(this.file);
      const fd = fs.openSync(this.file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_APPEND, 0o644);
      try {
        fs.ftruncateSync(fd, size); // a line cut short by a crash
      } catch (e) {
        fs.closeSync(fd);
        throw e;
      }
      this.fd = fd;
      this.ids = new Set(lines.map((l) => l.id));
      this.count = lines.length;
    } catch (e) {
      // A missing directory will not appear by retrying: permanent.
      const permanent = !fs.existsSync(path.dirname(path.resolve(this.file)));
      return { error: { message: (e as Error).message, permanent } };
    }
    return { error: null };
  }

  write(req: { changes: Change[] }): { error: PluginError | null; cursor: string } {
    if (this.fd === null) {
      return { error: { message: "not connected", not_connected: true }, cursor: "" };
    }
    if (this.broken()) {
      return { error: { message: `${this.file} is broken` }, cursor: "" };
    }
    const out: string[] = [];
    const added: string[] = [];
    for (const c of req.changes) {
      if (this.dedupe && this.ids.has(c.id)) {
        continue;
      }
      const line: Line = { id: c.id, subject: c.subject, payload: c.payload.toString("base64") };
      if (Object.keys(c.headers).length > 0) {
        line.headers = c.headers;
      }
      // Key order as the Go example writes them: id, subject, headers, payload.
      out.push(JSON.stringify({ id: line.id, subject: line.subject, headers: line.headers, payload: line.payload }), "\n");
      added.push(c.id);
    }
    if (added.length > 0) {
      try {
        const data = Buffer.from(out.join(""), "utf8");
        for (let off = 0; off < data.length; ) {
          off += fs.writeSync(this.fd, data, off, data.length - off);
        }
        fs.fsyncSync(this.fd);
      } catch (e) {
        return { error: { message: (e as Error).message, not_connected: true }, cursor: "" };
      }
      for (const id of added) {
        this.ids.add(id);
      }
      this.count += added.length;
    }
    return { error: null, cursor: String(this.count) };
  }

  delivered(req: { producer: string; cursor: string }): { ids: string[] } {
    let from = 0;
    if (req.cursor !== "") {
      from = Number(req.cursor);
      if (!Number.isInteger(from) || from < 0) {
        throw new StatusError(grpc.status.INVALID_ARGUMENT, `cursor ${JSON.stringify(req.cursor)} is not a line count`);
      }
    }
    const prefix = req.producer + ":";
    const { lines } = readLines(this.file);
    return { ids: lines.slice(from).map((l) => l.id).filter((id) => id.startsWith(prefix)) };
  }

  close(): { error: PluginError | null } {
    if (this.fd !== null) {
      const fd = this.fd;
      this.fd = null;
      try {
        fs.closeSync(fd);
      } catch (e) {
        return { error: { message: (e as Error).message } };
      }
    }
    return { error: null };
  }

  read(): { records: Record_[] } {
    const { lines } = readLines(this.file);
    return {
      records: lines.map((l) => ({
        id: l.id,
        subject: l.subject ?? "",
        payload: Buffer.from(l.payload ?? "", "base64"),
        headers: l.headers ?? {},
      })),
    };
  }

  break(): object {
    fs.writeFileSync(this.file + ".broken", "");
    return {};
  }

  heal(): object {
    fs.rmSync(this.file + ".broken", { force: true });
    return {};
  }
}

// register adds sink's Sink and Conformance services to server.
export function register(server: grpc.Server, protos: grpc.GrpcObject, sink: FileSink): void {
  server.addService(lookup(protos, "bridge.plugin.v1.Sink"), {
    Describe: unary(() => sink.describe()),
    Configure: unary((req: { config_json: Buffer }) => sink.configure(req)),
    Connect: unary(() => sink.connect()),
    Write: unary((req: { changes: Change[] }) => sink.write(req)),
    Delivered: unary((req: { producer: string; cursor: string }) => sink.delivered(req)),
    Close: unary(() => sink.close()),
  });
  server.addService(lookup(protos, "bridge.plugin.v1.Conformance"), {
    Read: unary(() => sink.read()),
    Break: unary(() => sink.break()),
    Heal: unary(() => sink.heal()),
  });
}
