#!/usr/bin/env bash
# steering-mode.sh: prints the frontends' steering mode make compose-test
# can run here, ebpf or kernel-hash, and says why on stderr. eBPF steering
# (deploy/compose.ebpf.yaml) needs a bpffs at /sys/fs/bpf on the host, root
# to bind it, and an engine that knows CAP_BPF (Docker Engine 20.10 from
# Debian refuses it as "unknown capability").
set -u
why() { echo "steering-mode: kernel-hash: $*" >&2; echo kernel-hash; exit 0; }
[ "$(id -u)" = 0 ] || why "not root"
mountpoint -q /sys/fs/bpf || why "no bpffs at /sys/fs/bpf"
id=$(docker create --cap-add BPF debian:bookworm-slim true 2>&1) ||
	why "the engine refuses CAP_BPF: $(echo "$id" | tail -1)"
docker rm "$id" >/dev/null
echo ebpf
