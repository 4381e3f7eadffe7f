#!/usr/bin/env bash
# Builds the Python example sink into one executable file, OUT: generates
# the gRPC code of the contract (sinks/pluginsink/pluginv1/sink.proto) and
# of gRPC's health service (examples/plugins/health.proto) with Debian's
# python3-grpc-tools, and packs it with the plugin's files into a zip
# application run by Debian's python3 (python3 -m zipapp), whose sha256 the
# bridge pins. Needs python3-grpcio and python3-grpc-tools (scripts/deps.sh).
#
#   examples/plugins/python-sink/build.sh /usr/local/lib/bridge/python-sink
set -euo pipefail
out=${1:?usage: build.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# Debian's interpreter, where python3-grpcio is; not whatever python3 is
# first on PATH (a virtualenv or pyenv would not have it).
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import grpc, grpc_tools.protoc' 2>/dev/null; then
	echo "python-sink: $python lacks grpc or grpc_tools: apt-get install python3-grpcio python3-grpc-tools (scripts/deps.sh)" >&2
	exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
"$python" -m grpc_tools.protoc -I "$root/sinks/pluginsink/pluginv1" -I "$root/examples/plugins" \
	--python_out="$stage" --grpc_python_out="$stage" sink.proto health.proto
cp "$here"/__main__.py "$here"/filesink.py "$here"/goplugin.py "$stage/"
mkdir -p "$(dirname "$out")"
"$python" -m zipapp "$stage" -p "$python" -o "$out.tmp.$$"
chmod 755 "$out.tmp.$$"
mv -f "$out.tmp.$$" "$out"
