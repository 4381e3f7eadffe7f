#!/usr/bin/env bash
# Regenerates the Go code of the plugin contract (sinks/pluginsink/pluginv1)
# with protoc and the pinned generators. With --check it regenerates into a
# temporary directory and fails when the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12      # google.golang.org/protobuf, as in go.mod
PROTOC_GEN_GO_GRPC=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc

command -v protoc >/dev/null || { echo "protogen: protoc not found: apt-get install -y protobuf-compiler" >&2; exit 1; }
tools=${BRIDGE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/bridge-tools}
mkdir -p "$tools"
GOBIN=$tools go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
GOBIN=$tools go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"

dir=sinks/pluginsink/pluginv1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PATH=$tools:$PATH protoc -I "$dir" \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	"$dir/sink.proto"

if [[ ${1:-} == --check ]]; then
	for f in sink.pb.go sink_grpc.pb.go; do
		if ! diff -u "$dir/$f" "$out/$f"; then
			echo "protogen: $dir/$f is not what $dir/sink.proto generates: run scripts/protogen.sh and commit" >&2
			exit 1
		fi
	done
	echo "protogen: $dir is current"
	exit 0
fi
cp "$out"/sink.pb.go "$out"/sink_grpc.pb.go "$dir/"
echo "protogen: wrote $dir/sink.pb.go $dir/sink_grpc.pb.go"
