#!/usr/bin/env bash
# Builds the GPU pack (make gpu-pack; docs/gpu.md): a folder that runs the
# GPU benchmark with one command on a machine without Go or network.
#
#   pack.sh OUT_DIR PYTHON
#
# PYTHON is the bench venv's (grpc_tools makes the descriptor set the
# portable stubs embed). The folder holds:
#
#   run.sh            the one command (bench/gpu/run.sh)
#   bin.tar.xz        stripped binaries: recmesh, embedder, frontend,
#                     loadgen, benchrun static (CGO_ENABLED=0); the
#                     accelerator linked against glibc (>= 2.34), since
#                     it dlopens the PJRT plugin
#   root/             the Python arms and bench-model scripts, laid out as
#                     in the repository
#   stubs/            gRPC stubs that work with any grpcio and protobuf
#   VERSION           the build's version
#
# It ends with `gpu-pack ok: bytes=<n> files=<k>`; the limit is 40 MiB.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: pack.sh OUT_DIR PYTHON" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$1 PY=$2
LIMIT=$(( 40 << 20 ))

rm -rf "$OUT" && mkdir -p "$OUT/root/bench/python" "$OUT/root/accelerator/jaxbench" "$OUT/stubs"
OUT=$(cd "$OUT" && pwd)
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT

cd "$ROOT"
VCS=$([ -d .git ] && echo -buildvcs=true || echo -buildvcs=false)
CGO_ENABLED=0 go build "$VCS" -trimpath -ldflags='-s -w' -o "$BUILD/bin/" \
	./cli/cmd/recmesh ./embedder/cmd/embedder ./frontend/cmd/frontend ./bench/cmd/loadgen
# benchrun is a module of its own, outside the workspace (see
# bench/cmd/benchrun/main.go).
(cd bench/cmd/benchrun && GOWORK=off CGO_ENABLED=0 go build "$VCS" -trimpath -ldflags='-s -w' -o "$BUILD/bin/" .)
go build "$VCS" -trimpath -ldflags='-s -w' -o "$BUILD/bin/" ./accelerator/cmd/accelerator
# The accelerator's newest glibc symbol decides which machines it runs on.
if command -v objdump >/dev/null; then
	need=$(objdump -T "$BUILD/bin/accelerator" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -n 1)
	echo "pack: accelerator needs ${need:-no versioned glibc symbols}"
fi
tar -C "$BUILD/bin" -cf - . | xz -6 -T0 >"$OUT/bin.tar.xz"

cp bench/python/*.py "$OUT/root/bench/python/"
cp accelerator/jaxbench/benchmodel.py accelerator/jaxbench/jaxbench.py "$OUT/root/accelerator/jaxbench/"
"$PY" -m grpc_tools.protoc -I proto/inference -I proto --include_imports \
	--descriptor_set_out="$BUILD/grpc_service.pb" proto/inference/grpc_service.proto
"$PY" bench/gpu/portable_stubs.py "$BUILD/grpc_service.pb" "$OUT/stubs"
cp bench/gpu/run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh"
"$BUILD/bin/recmesh" version >"$OUT/VERSION"

bytes=$(du -sb "$OUT" | cut -f1)
files=$(find "$OUT" -type f | wc -l)
if [ "$bytes" -gt "$LIMIT" ]; then
	echo "gpu-pack: $bytes bytes is over the 40 MiB limit" >&2
	exit 1
fi
echo "gpu-pack ok: bytes=$bytes files=$files"
