#!/usr/bin/env bash
# The demo: a throwaway PostgreSQL, the bridge with embedded NATS, a few
# sample writes, and the resulting JetStream messages printed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
bin="${XDG_CACHE_HOME:-$HOME/.cache}/bridge-demo/demo"
mkdir -p "$(dirname "$bin")"
if [ ! -x "$bin" ] || [ -n "$(find cmd bridge config sources sinks internal plugins go.mod go.sum -newer "$bin" -print -quit 2>/dev/null)" ]; then
  echo "building the demo with $(go version | cut -d' ' -f3) (the first build downloads modules and compiles nats-server: about 2 minutes on a cold cache)..." >&2
  start=$(date +%s)
  go build -o "$bin" ./cmd/demo
  echo "built in $(( $(date +%s) - start ))s" >&2
fi
exec "$bin" "$@"
