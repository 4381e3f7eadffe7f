#!/usr/bin/env bash
# Installs the benchmark's tools with go install, once: natscli v0.5.0 and
# the nats-server version go.mod pins, into
# ${BENCH_TOOLS:-${XDG_CACHE_HOME:-~/.cache}/bridge-bench/bin}.
# scripts/bench.sh needs them, and so does the test suite's TestSmoke
# (bench/cmd/benchrun), which installs them itself when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${BENCH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/bridge-bench/bin}"
mkdir -p "$tools"
if [ ! -x "$tools/nats" ]; then
  echo "installing natscli v0.5.0 into $tools" >&2
  GOBIN="$tools" go install github.com/nats-io/natscli/nats@v0.5.0
fi
ns_version="$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)"
if [ ! -x "$tools/nats-server-$ns_version" ]; then
  echo "installing nats-server $ns_version into $tools" >&2
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install "github.com/nats-io/nats-server/v2@$ns_version"
  mv "$tmp/nats-server" "$tools/nats-server-$ns_version"
  rm -rf "$tmp"
fi
