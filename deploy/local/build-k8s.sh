#!/usr/bin/env bash
# build-k8s.sh VERSION OUT COMMAND...
#
# Builds Kubernetes commands (kube-apiserver, kubectl, kubelet, ...) of
# release VERSION (v1.36.3) from the k8s.io/kubernetes module on the Go
# module proxy into the directory OUT; the command etcd is etcd's server
# at ETCD_VERSION (the environment's, v3.6.8 when unset).
#
# The module's go.mod replaces its staging modules (k8s.io/api, client-go,
# ...) with directories of its own tree, and a module zip leaves nested
# modules out, so the tree cannot build as downloaded. A small build module
# instead requires k8s.io/kubernetes at VERSION and points each staging
# module at its published twin, v0.<minor>.<patch>, which is the same
# source the release tagged. Static (no cgo), as the release builds them.
# A command already in OUT is kept: OUT is a cache that lives outside the
# checkout (mk/k8s.mk).
set -euo pipefail
version=$1 out=$2
shift 2
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
missing=()
for cmd in "$@"; do
	[ -x "$out/$cmd" ] || missing+=("$cmd")
done
if [ ${#missing[@]} = 0 ]; then
	exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/recmesh-k8s-XXXXXX")
trap 'rm -rf "$work"' EXIT

# module MODULE VERSION DIR: a build module in DIR that requires MODULE at
# VERSION and every module MODULE's go.mod pins, at its pin, so the build is
# the one the release tested rather than what minimal version selection
# would pick. Prints MODULE's go.mod.
module() {
	local gomod
	mkdir -p "$3"
	(cd "$3" && go mod init recmesh.local/build >/dev/null 2>&1 && go mod edit -go=1.26.0 -require="$1@$2")
	gomod=$(cd "$3" && go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	if [ -z "$gomod" ]; then
		echo "build-k8s: go mod download $1@$2 gave no go.mod" >&2
		return 1
	fi
	(cd "$3" && go mod edit -json "$gomod" | python3 -c '
import json, subprocess, sys
mod = json.load(sys.stdin)
args = ["-require=%s@%s" % (r["Path"], r["Version"]) for r in mod.get("Require") or []
        if r["Version"] != "v0.0.0"]
subprocess.run(["go", "mod", "edit"] + args, check=True)
')
	echo "$gomod"
}

# build DIR PACKAGE NAME
build() {
	local start
	start=$(date +%s)
	(cd "$1" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" \
		-o "$out/$3.tmp" "$2")
	mv "$out/$3.tmp" "$out/$3"
	echo "build-k8s: $3 ($2) -> $out/$3 ($(( $(date +%s) - start )) s)"
}

mkdir -p "$out"
k8s=
for cmd in "${missing[@]}"; do
	if [ "$cmd" = etcd ]; then
		# etcd's go.mod replaces its sibling modules with directories of its
		# repository; as a dependency those replaces are ignored and the
		# published siblings of the same version are used.
		module go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$work/etcd" >/dev/null
		build "$work/etcd" go.etcd.io/etcd/server/v3 etcd
		continue
	fi
	if [ -z "$k8s" ]; then
		k8s=$work/k8s
		gomod=$(module k8s.io/kubernetes "$version" "$k8s")
		# Every staging module the release replaces, except its samples
		# (never published, never needed by a command).
		for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' "$gomod" | grep -v '^k8s.io/sample-'); do
			(cd "$k8s" && go mod edit -replace="$m=$m@v0.${version#v1.}")
		done
	fi
	build "$k8s" "k8s.io/kubernetes/cmd/$cmd" "$cmd"
done
