#!/usr/bin/env bash
# base-images.sh TOOLS_DIR WORK_DIR
#
# Makes sure every base image that recmesh's Dockerfiles and compose.yaml
# name exists in the local engine. An image already there is kept; otherwise
# it is pulled, and where no registry answers (RECMESH_BASE_IMAGES=local
# forces this) a stand-in is built under the same name:
#
#   debian:bookworm-slim        debootstrap (Debian's mirror), plus the host's
#                               CA bundle, since this machine's egress may
#                               re-sign TLS
#   gcr.io/distroless/static-debian12:nonroot
#                               the same Debian root file system
#   golang:1.26-bookworm        Debian + gcc + the host's Go toolchain
#   python:3.12-slim-bookworm   Debian + python3-pip (a `pip` that may install
#                               system-wide, as the official image's does)
#   nats:2.12-alpine            Debian + nats-server built from its module
#   jaegertracing/jaeger:2.10.0 Debian + jaeger built from its module
#
# Stand-ins carry the label org.recmesh.stand-in=true. TOOLS_DIR holds the
# nats-server and jaeger binaries (make compose-tools builds them).
set -euo pipefail
tools=${1:?usage: base-images.sh TOOLS_DIR WORK_DIR} work=${2:?usage: base-images.sh TOOLS_DIR WORK_DIR}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mode=${RECMESH_BASE_IMAGES:-auto}
label=org.recmesh.stand-in=true
mkdir -p "$work"

have() { docker image inspect "$1" >/dev/null 2>&1; }

# pull IMAGE: try the registry once per run; after one failure, assume none.
registry=unknown
pull() {
	[ "$mode" = local ] && return 1
	[ "$registry" = none ] && return 1
	if timeout 60 docker pull -q "$1" >/dev/null 2>&1; then
		registry=yes
		echo "base-images: pulled $1"
		return 0
	fi
	registry=none
	echo "base-images: cannot pull $1: building local stand-ins (RECMESH_BASE_IMAGES=local skips the pull)"
	return 1
}

debian() {
	local img=debian:bookworm-slim
	have "$img" || pull "$img" && return 0
	[ "$(id -u)" = 0 ] || { echo "base-images: debootstrap needs root to build $img" >&2; exit 1; }
	command -v debootstrap >/dev/null || { echo "base-images: install Debian's debootstrap to build $img" >&2; exit 1; }
	local root=$work/rootfs
	rm -rf "$root"
	echo "base-images: debootstrap bookworm from $mirror (about a minute)"
	debootstrap --variant=minbase --include=ca-certificates,wget bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
		{ tail -20 "$work/debootstrap.log" >&2; exit 1; }
	# The host's trust store: builds with --network host reach the package
	# registries through whatever re-signs TLS here.
	cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
	tar -C "$root" -c . | docker import --change "LABEL $label" --change 'CMD ["/bin/bash"]' - "$img" >/dev/null
	rm -rf "$root"
	echo "base-images: built $img"
}

# derive IMAGE CONTEXT: builds IMAGE from the Dockerfile on stdin.
derive() {
	local img=$1 ctx=$2
	docker build -q --network host --label "$label" -t "$img" -f - "$ctx" >/dev/null
	echo "base-images: built $img"
}

debian
have gcr.io/distroless/static-debian12:nonroot || pull gcr.io/distroless/static-debian12:nonroot ||
	{ docker tag debian:bookworm-slim gcr.io/distroless/static-debian12:nonroot && echo "base-images: tagged gcr.io/distroless/static-debian12:nonroot"; }

if ! have golang:1.26-bookworm && ! pull golang:1.26-bookworm; then
	goroot=$(go env GOROOT)
	derive golang:1.26-bookworm "$goroot" <<'DOCKERFILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev git && rm -rf /var/lib/apt/lists/*
COPY . /usr/local/go
ENV GOPATH=/go PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin GOTOOLCHAIN=local
WORKDIR /go
DOCKERFILE
fi

if ! have python:3.12-slim-bookworm && ! pull python:3.12-slim-bookworm; then
	derive python:3.12-slim-bookworm "$work" <<'DOCKERFILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip && rm -rf /var/lib/apt/lists/* \
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && ln -s /usr/bin/pip3 /usr/local/bin/pip && ln -s /usr/bin/python3 /usr/local/bin/python
DOCKERFILE
fi

if ! have nats:2.12-alpine && ! pull nats:2.12-alpine; then
	derive nats:2.12-alpine "$tools" <<'DOCKERFILE'
FROM debian:bookworm-slim
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 8222
CMD ["nats-server"]
DOCKERFILE
fi

if ! have jaegertracing/jaeger:2.10.0 && ! pull jaegertracing/jaeger:2.10.0; then
	derive jaegertracing/jaeger:2.10.0 "$tools" <<'DOCKERFILE'
FROM debian:bookworm-slim
# As the official image: its configuration listens on localhost unless told
# otherwise, which would keep OTLP from the other containers out.
ENV JAEGER_LISTEN_HOST=0.0.0.0
COPY jaeger /cmd/jaeger/jaeger-linux
EXPOSE 4317 4318 16686 13133
VOLUME ["/tmp"]
USER 10001
ENTRYPOINT ["/cmd/jaeger/jaeger-linux"]
DOCKERFILE
fi
