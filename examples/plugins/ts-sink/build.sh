#!/usr/bin/env bash
# Builds the TypeScript example sink into the directory DIR: compiles src/
# with the pinned typescript (package-lock.json) and puts beside it the
# .proto files it loads at run time (the contract,
# sinks/pluginsink/pluginv1/sink.proto, and gRPC's health service,
# examples/plugins/health.proto) and its node_modules. The executable is
# DIR/ts-sink; its sha256 is what the bridge pins (the rest of DIR is not
# covered by it: keep DIR writable only by whoever may change the plugin).
#
# This directory's node_modules must be installed first: `npm ci` here
# (scripts/deps.sh does it). DIR/node_modules is a link to it; with
# --install, DIR gets its own (`npm ci --omit=dev` in DIR), for a DIR
# deployed on its own.
#
#   examples/plugins/ts-sink/build.sh [--install] /usr/local/lib/bridge/ts-sink
set -euo pipefail
install=false
if [ "${1:-}" = --install ]; then install=true; shift; fi
dir=${1:?usage: build.sh [--install] DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
command -v node >/dev/null || { echo "ts-sink: node not found: apt-get install nodejs npm (scripts/deps.sh)" >&2; exit 1; }
if [ ! -x "$here/node_modules/.bin/tsc" ]; then
	echo "ts-sink: $here/node_modules is not installed: run npm ci there (scripts/deps.sh does)" >&2
	exit 1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
"$here/node_modules/.bin/tsc" -p "$here/tsconfig.json" --outDir "$dir"
mv -f "$dir/main.js" "$dir/ts-sink"
chmod 755 "$dir/ts-sink"
cp "$root/sinks/pluginsink/pluginv1/sink.proto" "$root/examples/plugins/health.proto" "$dir/"
if $install; then
	[ -L "$dir/node_modules" ] && rm -f "$dir/node_modules"
	cp "$here/package.json" "$here/package-lock.json" "$dir/"
	(cd "$dir" && npm ci --omit=dev --no-audit --no-fund)
elif [ "$(readlink "$dir/node_modules" 2>/dev/null)" != "$here/node_modules" ]; then
	rm -rf "$dir/node_modules"
	ln -s "$here/node_modules" "$dir/node_modules"
fi
