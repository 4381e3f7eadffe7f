#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine:
# PostgreSQL 15 server binaries, the wal2json plugin, PostGIS (the type
# tests store geometry and geography), and promtool (Debian's
# prometheus package) for the alert rules' tests in deploy/, and Chromium
# (Debian's chromium package, /usr/bin/chromium) for the web console's
# browser tests (bridge/e2e/console_test.go). Idempotent.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || need+=(postgresql-15)
[ -f /usr/lib/postgresql/15/lib/wal2json.so ] || need+=(postgresql-15-wal2json)
[ -f /usr/share/postgresql/15/extension/postgis.control ] || need+=(postgresql-15-postgis-3)
command -v promtool >/dev/null || need+=(prometheus)
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing ${need[*]}" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  # The Debian packages start services of their own (a PostgreSQL cluster,
  # a Prometheus server); the tests never use them.
  $SUDO service postgresql stop >/dev/null 2>&1 || true
  $SUDO service prometheus stop >/dev/null 2>&1 || true
fi
command -v go >/dev/null || { echo "Go is required (https://go.dev/dl/)" >&2; exit 1; }
