#!/usr/bin/env bash
# The demo: a throwaway PostgreSQL, the bridge with embedded NATS, a few
# sample writes, and the resulting JetStream messages printed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
exec go run ./cmd/demo "$@"
