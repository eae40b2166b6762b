#!/usr/bin/env bash
# Regenerates proto/ Go code with pinned generators. `make proto`.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${INPLACED_TOOLS:-/var/cache/inplaced/tools}
GEN_GO=v1.36.12
GEN_GRPC=v1.5.1
bin="$TOOLS/protoc-gen/$GEN_GO-$GEN_GRPC"
# hack/install-deps.sh (run first by make test) builds the same pins into
# $TOOLS/bin: use those rather than build them a second time.
if [ "$(cat "$TOOLS/bin/.protoc-gen-go.version" 2>/dev/null)" = "$GEN_GO" ] && [ -x "$TOOLS/bin/protoc-gen-go" ] &&
  [ "$(cat "$TOOLS/bin/.protoc-gen-go-grpc.version" 2>/dev/null)" = "$GEN_GRPC" ] && [ -x "$TOOLS/bin/protoc-gen-go-grpc" ]; then
  bin="$TOOLS/bin"
fi
if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ]; then
  mkdir -p "$bin"
  GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@$GEN_GO
  GOBIN="$bin" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$GEN_GRPC
fi
command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
PATH="$bin:$PATH" protoc -I proto \
  --go_out=proto --go_opt=paths=source_relative \
  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
  proto/inplaced/v1/control.proto
