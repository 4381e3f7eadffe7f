#!/usr/bin/env bash
# The tests: real PostgreSQL clusters and in-process nats-servers that the
# tests start themselves. Set TEST_LONG=1 for the long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/benchtools.sh # natscli and nats-server for TestSmoke, built before the tests run
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
echo "vetting and running the tests (a cold module and build cache adds a few minutes before the first test runs)..." >&2
go vet ./...
# -parallel 4: the parallel e2e tests mostly wait on their servers
# (Postgres, nats-server, bridge processes), so four at once keep the two
# cores busy where GOMAXPROCS (2) leaves them idle; the serial ones still run
# alone, and the long ones start first (bridge/e2e/doc.go).
go test -race -count=1 -timeout 60m -parallel 4 ./... "$@"
