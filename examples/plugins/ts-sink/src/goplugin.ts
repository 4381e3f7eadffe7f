// go-plugin's side of a plugin, for a plugin written in TypeScript on Node.
//
// hashicorp/go-plugin (which the bridge uses to run plugins) speaks to a
// plugin in any language through gRPC once the plugin has
//
//  1. checked the magic cookie in its environment (a plugin refuses to run
//     when a person starts it by hand),
//  2. agreed a protocol version: the bridge lists the majors it speaks in
//     PLUGIN_PROTOCOL_VERSIONS; the plugin answers with the one it serves,
//  3. served gRPC's health service, with "plugin" SERVING,
//  4. printed the handshake line on stdout:
//     `1|<app protocol version>|unix|<socket path>|grpc`, the socket in the
//     directory PLUGIN_UNIX_SOCKET_DIR names (the bridge makes one per
//     process, mode 0700).
//
// serve() does those four steps around the services a plugin registers.

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

// go-plugin's own protocol version (the first field of the handshake).
const CORE_PROTOCOL_VERSION = 1;

// How the example plugins load .proto files: field names as in the file,
// 64-bit integers as decimal strings, bytes as Buffers, defaults filled in.
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: Number,
  defaults: true,
  oneofs: true,
};

// load reads the .proto files shipped beside the compiled plugin.
export function load(...files: string[]): grpc.GrpcObject {
  const def = protoLoader.loadSync(
    files.map((f) => path.join(__dirname, f)),
    LOADER_OPTIONS,
  );
  return grpc.loadPackageDefinition(def);
}

// lookup returns the service definition at a dotted name of a loaded package.
export function lookup(root: grpc.GrpcObject, name: string): grpc.ServiceDefinition {
  let o: any = root;
  for (const part of name.split(".")) {
    o = o?.[part];
  }
  if (!o?.service) {
    throw new Error(`no service ${name} in the loaded .proto files`);
  }
  return o.service as grpc.ServiceDefinition;
}

function refuse(msg: string): never {
  process.stderr.write(msg + "\n");
  process.exit(1);
}

export interface ServeOptions {
  cookieKey: string;
  cookieValue: string;
  // version is the application protocol version (the contract's major).
  version: number;
  // register adds the plugin's services to the server.
  register: (server: grpc.Server) => void;
}

// serve starts serving; the process runs until the bridge stops it.
export function serve(opts: ServeOptions): void {
  if (process.env[opts.cookieKey] !== opts.cookieValue) {
    refuse(
      `This is a plugin of the bridge (bridge.plugin.v${opts.version}): it is started by the bridge, ` +
        "not by hand (sink type plugin, or `bridge plugin test <this file>`).",
    );
  }
  const offered = process.env.PLUGIN_PROTOCOL_VERSIONS ?? "";
  if (offered !== "" && !offered.split(",").map((v) => v.trim()).includes(String(opts.version))) {
    refuse(
      `this plugin serves version ${opts.version} of the plugin contract, the bridge offers ${offered}: ` +
        "use a plugin built for one of those",
    );
  }

  // The bridge sends whole batches: no 4 MiB limit on what it sends.
  const server = new grpc.Server({
    "grpc.max_receive_message_length": -1,
    "grpc.max_send_message_length": -1,
  });
  const health = load("health.proto");
  server.addService(lookup(health, "grpc.health.v1.Health"), {
    Check: (call: grpc.ServerUnaryCall<{ service: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      const svc = call.request.service;
      if (svc !== "" && svc !== "plugin") {
        cb({ code: grpc.status.NOT_FOUND, details: `unknown service ${svc}` });
        return;
      }
      cb(null, { status: 1 }); // SERVING
    },
  });
  opts.register(server);
  // A unix socket in the directory the bridge made for this process (mode
  // 0700): only the bridge's user reaches it, where a port on loopback would
  // let every process of the machine read and write.
  const dir = process.env.PLUGIN_UNIX_SOCKET_DIR || fs.mkdtempSync(path.join(os.tmpdir(), "bridge-plugin-"));
  const sock = path.join(dir, "plugin.sock");
  server.bindAsync(`unix:${sock}`, grpc.ServerCredentials.createInsecure(), (err) => {
    if (err) {
      refuse(`cannot listen on ${sock}: ${err.message}`);
    }
    // On Linux a write to a pipe is synchronous: the line is out at once.
    process.stdout.write(`${CORE_PROTOCOL_VERSION}|${opts.version}|unix|${sock}|grpc\n`);
  });
}

// StatusError is an error answered with a gRPC status code.
export class StatusError extends Error {
  constructor(
    readonly status: grpc.status,
    message: string,
  ) {
    super(message);
  }
}

// unary adapts a synchronous handler to grpc-js: what it returns is the
// answer, what it throws an error status (a StatusError's, else UNKNOWN).
// Being synchronous, a handler runs whole before the next call starts.
export function unary<Req, Res>(fn: (req: Req) => Res): grpc.handleUnaryCall<Req, Res> {
  return (call, cb) => {
    let res: Res;
    try {
      res = fn(call.request);
    } catch (e) {
      const code = e instanceof StatusError ? e.status : grpc.status.UNKNOWN;
      cb({ code, details: e instanceof Error ? e.message : String(e) });
      return;
    }
    cb(null, res);
  };
}
