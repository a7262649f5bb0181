#!/usr/bin/env bash
# The GPU pack's one command: recmesh's accelerator on a GPU through PJRT
# CUDA, measured against JAX on the same GPU. `make gpu-pack` builds the
# pack this script sits in (docs/gpu.md); the GPU machine needs no Go and
# no network, only its Python with jax, numpy, grpcio and protobuf.
#
#   run.sh [--cpu] [--plugin SO] [--python PY] [--max-vocab N]
#          [--server-cpus LIST] [--client-cpus LIST] RESULTS_DIR
#
# In order, everything written under RESULTS_DIR (large files, the bundles,
# go to a scratch folder outside it, ${RECMESH_GPU_WORK:-$TMPDIR}):
#
#   1. unpacks the binaries and finds the plugin: on a GPU the CUDA plugin
#      of PJRT C API 0.81 (xla_gpu_pjrt.so.xz beside the pack, from PyPI's
#      xla-cuda13-pjrt==0.0.1), with CUDA 13's libraries from the Python's
#      nvidia-* packages on the loader path; with --cpu the CPU plugin;
#   2. exports both workloads of the benchmark (mlperf and hostbound, cap
#      850000: the 3.2 GB tables; --cpu: cap 1000);
#   3. parity on every bucket (`parity ok:`), and, on a GPU, what the
#      image's own newer jax-cuda13-pjrt plugin does (image-plugin.txt);
#   4. bench-model per bucket: the PJRT program against jax.jit on the same
#      device (`model:` lines);
#   5. a short benchmark, recmesh-slo against py-mp-batch (JAX on the same
#      device), B_req 1/16/128, server and load generator on separate CPUs
#      (`bench:` and `bench-ratio:` lines);
#
# and ends with `gpu-run ok: backend=<cpu|cuda> parity_max_abs_diff=<d> …`.
# --cpu is the rehearsal on a machine without a GPU (short windows).
set -euo pipefail

usage() { sed -n '7,9p' "$0" >&2; exit 2; }

PACK=$(cd "$(dirname "$0")" && pwd)
BACKEND=cuda PLUGIN="" PY="" VOCAB="" SERVER_CPUS="" CLIENT_CPUS="" RESULTS=""
while [ $# -gt 0 ]; do
	case "$1" in
	--cpu) BACKEND=cpu ;;
	--plugin) PLUGIN=$2; shift ;;
	--python) PY=$2; shift ;;
	--max-vocab) VOCAB=$2; shift ;;
	--server-cpus) SERVER_CPUS=$2; shift ;;
	--client-cpus) CLIENT_CPUS=$2; shift ;;
	-h|--help) usage ;;
	-*) echo "run.sh: unknown option $1" >&2; usage ;;
	*) [ -z "$RESULTS" ] || usage; RESULTS=$1 ;;
	esac
	shift
done
[ -n "$RESULTS" ] || usage
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
START=$(date +%s)
LOG=$RESULTS/run.log
: >"$LOG"
say() { echo "gpu-run: $*" | tee -a "$LOG"; }
fail() { say "FAILED: $*"; exit 1; }
# step NAME CMD…: runs CMD with its output in RESULTS/NAME.log and on the
# terminal (standard lines pass through), timed.
step() {
	local name=$1; shift
	local t0; t0=$(date +%s)
	say "$name: $*"
	if ! "$@" > >(tee "$RESULTS/$name.log") 2>&1; then
		tail -n 40 "$RESULTS/$name.log" >&2
		fail "$name exited non-zero (whole output in $name.log)"
	fi
	say "$name: done in $(( $(date +%s) - t0 )) s"
}

NCPU=$(nproc)
if [ -z "$SERVER_CPUS" ] || [ -z "$CLIENT_CPUS" ]; then
	# The published study: the server on half the cores, the load generator
	# on the other half (8 + 8 on the 16-core GPU machine).
	if [ "$NCPU" -ge 2 ]; then
		half=$(( NCPU / 2 ))
		SERVER_CPUS=${SERVER_CPUS:-0-$(( half - 1 ))}
		CLIENT_CPUS=${CLIENT_CPUS:-$half-$(( NCPU - 1 ))}
	fi
fi

if [ "$BACKEND" = cpu ]; then
	VOCAB=${VOCAB:-1000}
	BUCKETS=1,16,128 ROUNDS=1 MODEL_SECONDS=0.3
	CLIENTS=1,4 WARMUP=300ms DURATION=1s
else
	VOCAB=${VOCAB:-850000}
	BUCKETS=1,16,128 ROUNDS=2 MODEL_SECONDS=2
	CLIENTS=4,32 WARMUP=1s DURATION=3s
fi

WORK=${RECMESH_GPU_WORK:-${TMPDIR:-/tmp}}/recmesh-gpu-run
rm -rf "$WORK" && mkdir -p "$WORK/bin" "$WORK/data"
trap 'rm -rf "$WORK/data"' EXIT

# 1. Binaries, Python, plugin.
PY=${PY:-$(command -v python3)}
[ -x "$PY" ] || fail "no python3 (give --python)"
"$PY" - "$PACK/bin.tar.xz" "$WORK/bin" <<'EOF' || fail "cannot unpack bin.tar.xz"
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2])
EOF
"$PY" - >"$RESULTS/python.json" <<'EOF' || fail "the Python lacks what the arms need (jax, numpy, grpcio, protobuf)"
import json, sys, importlib.metadata as m
import jax, numpy, grpc, google.protobuf
v = {"python": sys.version.split()[0], "jax_devices": [d.device_kind for d in jax.devices()]}
for d in ("jax", "jaxlib", "numpy", "grpcio", "protobuf", "jax-cuda13-pjrt", "jax-cuda13-plugin"):
    try:
        v[d] = m.version(d)
    except Exception:
        pass
print(json.dumps(v))
EOF
say "python $PY: $(cat "$RESULTS/python.json")"

JAX_PLATFORM=cpu
IMAGE_PLUGIN=""
if [ "$BACKEND" = cuda ]; then
	JAX_PLATFORM=cuda
	command -v nvidia-smi >/dev/null && nvidia-smi >"$RESULTS/nvidia-smi.txt" 2>&1 || true
	if [ -z "$PLUGIN" ]; then
		for xz in "$PACK/xla_gpu_pjrt.so.xz" "$PACK/../gpu-plugin/xla_gpu_pjrt.so.xz" "$PACK/../xla_gpu_pjrt.so.xz"; do
			[ -f "$xz" ] || continue
			say "decompressing $xz"
			"$PY" - "$xz" "$WORK/xla_gpu_pjrt.so" <<'EOF'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 24)
EOF
			PLUGIN=$WORK/xla_gpu_pjrt.so
			break
		done
	fi
	[ -n "$PLUGIN" ] || fail "no CUDA plugin: put xla_gpu_pjrt.so.xz (make gpu-pack) beside the pack or give --plugin"
	# CUDA 13's cublas, cudnn and cupti come with the image's nvidia-*
	# Python packages; the plugin finds them on the loader path.
	NVLIBS=$("$PY" - <<'EOF'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        if d not in seen:
            seen.append(d)
print(":".join(seen))
EOF
)
	# The plugin also names the driver's unversioned libcuda.so, which
	# only driver development packages install: point it at libcuda.so.1.
	mkdir -p "$WORK/lib"
	if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
		cuda1=$(ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 .*=> //p' | head -n 1)
		[ -n "$cuda1" ] && ln -sf "$cuda1" "$WORK/lib/libcuda.so"
	fi
	export LD_LIBRARY_PATH=$WORK/lib${NVLIBS:+:$NVLIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	say "CUDA libraries: ${NVLIBS:-none found}; driver $(ldconfig -p 2>/dev/null | grep -m1 -o 'libcuda\.so\.1 .*' || echo 'libcuda.so.1 not in ldconfig')"
	IMAGE_PLUGIN=$("$PY" -c 'import os, jax_plugins.xla_cuda13 as m; print(os.path.join(os.path.dirname(m.__file__), "xla_cuda_plugin.so"))' 2>/dev/null || true)
else
	if [ -z "$PLUGIN" ]; then
		PLUGIN=${RECMESH_PJRT_PLUGIN:-}
		[ -n "$PLUGIN" ] || PLUGIN=$(ls "$PACK"/../pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2>/dev/null || true)
	fi
	[ -n "$PLUGIN" ] || fail "--cpu needs the CPU plugin: give --plugin (make deps puts it in .deps/pjrt)"
fi
PLUGIN=$(cd "$(dirname "$PLUGIN")" && pwd)/$(basename "$PLUGIN")
export RECMESH_PJRT_PLUGIN=$PLUGIN RECMESH_BENCH_JAX_PLATFORM=$JAX_PLATFORM
say "backend $BACKEND, plugin $PLUGIN, server CPUs ${SERVER_CPUS:-all}, load generator CPUs ${CLIENT_CPUS:-all}"

# 2. Both workloads on the same tables.
MLPERF=$WORK/data/mlperf HOSTBOUND=$WORK/data/hostbound
step export-mlperf "$WORK/bin/recmesh" export --max-vocab "$VOCAB" --seed 1 --out "$MLPERF"
step export-hostbound "$WORK/bin/recmesh" export --preset hostbound --max-vocab "$VOCAB" --seed 1 --out "$HOSTBOUND"

# 3. Parity on every bucket, both workloads.
step parity-mlperf "$WORK/bin/accelerator" parity --bundle "$MLPERF"
step parity-hostbound "$WORK/bin/accelerator" parity --bundle "$HOSTBOUND"
PARITY=$(grep -h '^parity ok:' "$RESULTS/parity-mlperf.log" "$RESULTS/parity-hostbound.log" |
	sed -n 's/.*max_abs_diff=\([^ ]*\).*/\1/p' | sort -g | tail -n 1)
[ -n "$PARITY" ] || fail "no parity ok line"
if [ -n "$IMAGE_PLUGIN" ] && [ -f "$IMAGE_PLUGIN" ]; then
	# The image's jax-cuda13-pjrt plugin speaks a newer PJRT C API: record
	# the refusal, then what happens when it is tried anyway.
	{
		echo "== $IMAGE_PLUGIN, as refused by default"
		timeout 120 "$WORK/bin/accelerator" parity --bundle "$MLPERF" --pjrt-plugin "$IMAGE_PLUGIN" 2>&1 | tail -n 5 || true
		echo "== tried anyway (--pjrt-allow-newer)"
		timeout 180 "$WORK/bin/accelerator" parity --bundle "$MLPERF" --pjrt-plugin "$IMAGE_PLUGIN" --pjrt-allow-newer 2>&1 | tail -n 15 || true
	} >"$RESULTS/image-plugin.txt"
	say "image plugin: $(grep -m1 -E 'parity ok|incompatible|Unexpected|error|FAILED' "$RESULTS/image-plugin.txt" | tail -c 300)"
fi

# 4. bench-model: the PJRT program against jax.jit on the same device.
step bench-model "$PY" "$PACK/root/accelerator/jaxbench/benchmodel.py" --accelerator "$WORK/bin/accelerator" \
	--bundle "$MLPERF" --plugin "$PLUGIN" --platform "$JAX_PLATFORM" --cpu "${SERVER_CPUS:-0-$(( NCPU - 1 ))}" \
	--buckets "$BUCKETS" --rounds "$ROUNDS" --duration "$MODEL_SECONDS" --python "$PY"

# 5. The short benchmark.
step bench "$WORK/bin/benchrun" -root "$PACK/root" -bin "$WORK/bin" -python "$PY" -py-stubs "$PACK/stubs" \
	-workloads "mlperf=$MLPERF,hostbound=$HOSTBOUND" -results "$RESULTS/bench" \
	-arms recmesh-slo,py-mp-batch -batches 1,16,128 -clients "$CLIENTS" -open 0.8 \
	-warmup "$WARMUP" -duration "$DURATION" -repeats 1 -connections 32 \
	-dense-cost=false -memory-arms '' -strict \
	-server-cpus "$SERVER_CPUS" -client-cpus "$CLIENT_CPUS"

model=$(grep '^model: bucket=' "$RESULTS/bench-model.log" | sed -n 's/^model: bucket=\([0-9]*\) \(dense_dtype=[a-z0-9]* \)\{0,1\}examples_per_s=\([0-9]*\) jax_examples_per_s=\([0-9]*\) .* ratio=\([0-9.]*\).*/b\1=\3\/\4(\5)/p' | paste -sd, -)
ratios=$(grep '^bench-ratio:' "$RESULTS/bench.log" | sed -n 's/^bench-ratio: workload=\([a-z]*\) b_req=\([0-9]*\) .* ratio=\([^ ]*\).*/\1_b\2=\3/p' | paste -sd, -)
say "wall time $(( $(date +%s) - START )) s"
echo "gpu-run ok: backend=$BACKEND plugin=$(basename "$PLUGIN") parity_max_abs_diff=$PARITY model=${model:-none} bench_ratio=${ratios:-none} wall_s=$(( $(date +%s) - START ))" | tee -a "$LOG"
