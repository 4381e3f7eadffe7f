"""python-sink: the example sink plugin in Python (see filesink.py).

Build it (scripts/deps.sh installs Debian's python3-grpcio and
python3-grpc-tools), pin its sha256 and name it in bridge.yaml:

    examples/plugins/python-sink/build.sh /usr/local/lib/bridge/python-sink
    sha256sum /usr/local/lib/bridge/python-sink
    bridge plugin test /usr/local/lib/bridge/python-sink --plugin-config '{"path": "/tmp/t.jsonl"}'

    sinks:
      file:
        type: plugin
        config:
          command: /usr/local/lib/bridge/python-sink
          sha256: "<the sum>"
          config: { path: /var/lib/cdc/changes.jsonl }

build.sh generates the gRPC code from the contract (sink.proto) and packs it
with these files into one executable zip (python3 -m zipapp), so the sha256
the bridge checks covers all of the plugin's own code.
"""

import filesink
import goplugin

# The contract's major (bridge.plugin.v1) and the bridge's magic cookie:
# sinks/pluginsink/pluginv1/plugin.go.
PROTOCOL_VERSION = 1
MAGIC_COOKIE_KEY = "BRIDGE_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "bridge-sink-plugin-7c5f1e2a"


def main():
    sink = filesink.FileSink()
    goplugin.serve(
        lambda server: filesink.register(server, sink),
        cookie_key=MAGIC_COOKIE_KEY,
        cookie_value=MAGIC_COOKIE_VALUE,
        version=PROTOCOL_VERSION,
    )


if __name__ == "__main__":
    main()
