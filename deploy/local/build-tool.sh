#!/usr/bin/env bash
# build-tool.sh MODULE VERSION PACKAGE OUT [LDFLAGS]
#
# Builds one command of a published Go module from the module proxy, the way
# its own release does, into OUT. `go install MODULE/PACKAGE@VERSION` refuses
# modules whose go.mod has replace or exclude directives (Jaeger, Compose),
# so the module is downloaded, copied out of the read-only module cache and
# built in place with its own go.mod. Static (no cgo); the host's Go build
# cache makes a rebuild cheap.
set -euo pipefail
module=$1 version=$2 pkg=$3 out=$4 ldflags=${5:-}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ]; then
	echo "build-tool: go mod download $module@$version gave no directory" >&2
	exit 1
fi
src=$(mktemp -d "${TMPDIR:-/tmp}/recmesh-tool-XXXXXX")
trap 'chmod -R u+w "$src" && rm -rf "$src"' EXIT
cp -r "$dir/." "$src/"
chmod -R u+w "$src"
mkdir -p "$(dirname "$out")"
(cd "$src" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
mv "$out.tmp" "$out"
echo "build-tool: $module@$version $pkg -> $out"
