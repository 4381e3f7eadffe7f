#!/usr/bin/env node
// ts-sink: the example sink plugin in TypeScript on Node (see filesink.ts).
//
// Build it (scripts/deps.sh runs `npm ci` here), pin its sha256 and name it
// in bridge.yaml:
//
//   examples/plugins/ts-sink/build.sh /usr/local/lib/bridge/ts-sink
//   sha256sum /usr/local/lib/bridge/ts-sink/ts-sink
//   bridge plugin test /usr/local/lib/bridge/ts-sink/ts-sink --plugin-config '{"path": "/tmp/t.jsonl"}'
//
//   sinks:
//     file:
//       type: plugin
//       config:
//         command: /usr/local/lib/bridge/ts-sink/ts-sink
//         sha256: "<the sum>"
//         config: { path: /var/lib/cdc/changes.jsonl }

import { FileSink, register } from "./filesink";
import { load, serve } from "./goplugin";

// The contract's major (bridge.plugin.v1) and the bridge's magic cookie:
// sinks/pluginsink/pluginv1/plugin.go.
const PROTOCOL_VERSION = 1;
const MAGIC_COOKIE_KEY = "BRIDGE_PLUGIN_MAGIC_COOKIE";
const MAGIC_COOKIE_VALUE = "bridge-sink-plugin-7c5f1e2a";

const sink = new FileSink();
serve({
  cookieKey: MAGIC_COOKIE_KEY,
  cookieValue: MAGIC_COOKIE_VALUE,
  version: PROTOCOL_VERSION,
  register: (server) => register(server, load("sink.proto"), sink),
});
