#!/usr/bin/env bash
# The performance benchmark: one run starts a private Postgres and a
# nats-server process, measures pg_recvlogical (Postgres' own decode rate),
# `nats bench js pub` (JetStream's own ingest rate), the bridge binary and
# the straightforward pipe (bench/cmd/pipe) on the same backlogs and live,
# and prints the figures side by side.
#
#   ./scripts/bench.sh                 # ~5 minutes: 200k single-row txns, 10 x 100k-row txns, 20s live
#   ./scripts/bench.sh --quick         # ~1 minute
#   ./scripts/bench.sh --profile DIR   # also CPU/alloc profiles of the bridge during the backlogs
#   ./scripts/bench.sh -single 500000 -live-rate 5000 -json out.json   # any benchrun flag (-h lists them)
#
# BRIDGE_* variables reach the bridge under test, e.g.
# BRIDGE_SINKS__JS__CONFIG__MAX_PENDING=16384 ./scripts/bench.sh --quick
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh

./scripts/benchtools.sh
tools="${BENCH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/bridge-bench/bin}"
ns_version="$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)"

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bridge" ./cmd/bridge
go build -o "$bin/bridgeprof" ./bench/cmd/bridgeprof
go build -o "$bin/pipe" ./bench/cmd/pipe
go build -o "$bin/benchrun" ./bench/cmd/benchrun

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(-quick) ;;
    --profile) args+=(-profile "$2"); shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
"$bin/benchrun" -bridge "$bin/bridge" -bridgeprof "$bin/bridgeprof" -pipe "$bin/pipe" \
  -nats "$tools/nats" -nats-server "$tools/nats-server-$ns_version" "${args[@]}"
