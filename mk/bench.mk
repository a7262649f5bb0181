# bench.mk — the benchmark harness (bench/):
#
#   make bench-py-deps    the Python arms' venv ($(DEPS)/bench-venv, pinned
#                         bench/python/requirements.txt, PyPI only) and their
#                         gRPC stubs, generated from proto/inference with
#                         grpcio-tools into $(DEPS)/bench-pygen
#   make bench-loadgen    build bin/loadgen
#   make bench-py-smoke   start the `py` arm on the small bundle, check parity,
#                         drive it for 5 s (B_req 16, C 4) with the server
#                         monitored, write bench/results/smoke/py.json;
#                         BENCH_SERVER_CPUS / BENCH_CLIENT_CPUS (CPU lists,
#                         e.g. 0 and 1) pin the server (taskset) and loadgen
#   make bench            the quick sweep (bench/cmd/benchrun) on the small
#                         bundle: every arm, B_req 1,16,128, C 1,4,16, open
#                         loop at 50/80 % of peak, 1 s windows, the memory
#                         check; writes bench/results/REPORT.md (+ SVGs) and
#                         ends with one `bench: arm=… b_req=…` line per arm
#                         and B_req. Every knob is a BENCH_* variable below.
#   make bench-full       the published methodology on the 3.2 GB bundle
#                         (C up to 256, 5 s warm-up + 30 s windows, 3
#                         repeats; hours) into bench/results/full; knobs are
#                         BENCH_FULL_* variables
#   make bench-smoke      the CI smoke: recmesh-full and py, B_req 1,16, C
#                         1,4, ~1 s windows, no memory check, into
#                         bench/results/ci-smoke (about a minute)
#
# Included by the root Makefile, which defines ROOT, DEPS, BIN, GO, PYTHON
# and DEV_BUNDLE. `make deps` (and so `make test`) also installs the Python
# arm, since the bench tests start it (they skip without it only outside CI).

BENCH_DIR      := $(ROOT)/bench
BENCH_VENV     := $(DEPS)/bench-venv
BENCH_PY       := $(BENCH_VENV)/bin/python
BENCH_PYGEN    := $(DEPS)/bench-pygen
BENCH_REQS     := $(BENCH_DIR)/python/requirements.txt
BENCH_PROTO    := $(ROOT)/proto/inference/grpc_service.proto
BENCH_RESULTS  := $(BENCH_DIR)/results
BENCH_SMOKE_ARGS ?= -batch 16 -concurrency 4 -warmup 2s -duration 5s
BENCH_SERVER_CPUS ?=
BENCH_CLIENT_CPUS ?=
BENCH_SERVER_PIN := $(if $(BENCH_SERVER_CPUS),taskset -c $(BENCH_SERVER_CPUS))
BENCH_CLIENT_PIN := $(if $(BENCH_CLIENT_CPUS),-cpus $(BENCH_CLIENT_CPUS))

.PHONY: bench-py-deps bench-loadgen bench-py-smoke bench-benchrun bench bench-full bench-smoke

deps: bench-py-deps

bench-py-deps: $(BENCH_VENV)/.stamp $(BENCH_PYGEN)/.stamp

# The stamp lives inside the venv, so deleting the venv reinstalls it; the
# requirements file pins every package, transitive ones included.
$(BENCH_VENV)/.stamp: $(BENCH_REQS)
	rm -rf $(BENCH_VENV)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install --quiet --disable-pip-version-check -r $(BENCH_REQS)
	@touch $@

# Stubs are generated, not checked in: the .proto stays the one source, and
# the protobuf runtime in the venv always matches the generator beside it.
$(BENCH_PYGEN)/.stamp: $(BENCH_PROTO) $(BENCH_VENV)/.stamp
	rm -rf $(BENCH_PYGEN) && mkdir -p $(BENCH_PYGEN)
	$(BENCH_PY) -m grpc_tools.protoc -I $(dir $(BENCH_PROTO)) \
		--python_out=$(BENCH_PYGEN) --grpc_python_out=$(BENCH_PYGEN) $(BENCH_PROTO)
	@touch $@

bench-loadgen: $(DEPS)/go.stamp
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/loadgen ./bench/cmd/loadgen

bench-py-smoke: bench-py-deps bench-loadgen $(DEV_BUNDLE)/model.safetensors
	@mkdir -p $(BENCH_RESULTS)/smoke
	@set -euo pipefail; \
	out=$$(mktemp); \
	$(BENCH_SERVER_PIN) $(BENCH_PY) $(BENCH_DIR)/python/server.py --mode py --port 0 --bundle $(DEV_BUNDLE) \
		--stubs $(BENCH_PYGEN) --workers 4 --warm-max 16 >$$out 2>$(BENCH_RESULTS)/smoke/py.log & \
	pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -f $$out' EXIT; \
	for i in $$(seq 240); do grep -q '^READY ' $$out && break; kill -0 $$pid || { cat $(BENCH_RESULTS)/smoke/py.log; exit 1; }; sleep 0.5; done; \
	addr=$$(awk '/^READY /{print $$2}' $$out); \
	test -n "$$addr" || { echo "bench-py-smoke: server not ready in 120 s" >&2; exit 1; }; \
	$(BIN)/loadgen parity -target $$addr -bundle $(DEV_BUNDLE) $(BENCH_CLIENT_PIN); \
	$(BIN)/loadgen run -target $$addr -bundle $(DEV_BUNDLE) -arm py -monitor-pids $$pid $(BENCH_CLIENT_PIN) \
		-out $(BENCH_RESULTS)/smoke/py.json $(BENCH_SMOKE_ARGS)

## The sweep driver. Pinning: BENCH_SERVER_CPUS / BENCH_CLIENT_CPUS when
## set, else benchrun's default split of the machine (2 CPUs: server 0,
## load generator 1). BENCH_ARGS adds any other benchrun flag (for example
## "-server-cpus= -client-cpus=" to pin nothing).

BENCH_ARMS             ?= recmesh-full,recmesh-model,recmesh-none,py,py-mp
BENCH_BATCHES          ?= 1,16,128
BENCH_CLIENTS          ?= 1,4,16
BENCH_OPEN             ?= 0.5,0.8
BENCH_WARMUP           ?= 500ms
BENCH_DURATION         ?= 1s
BENCH_REPEATS          ?= 1
BENCH_CONNECTIONS      ?= 64
BENCH_FRONTENDS        ?= 2
BENCH_PY_PROCESSES     ?= 2
BENCH_PY_WORKERS       ?= 8
BENCH_MEMORY_ARMS      ?= recmesh-full,py-mp
BENCH_MEMORY_INSTANCES ?= 1,2,4
BENCH_MEMORY_DURATION  ?= 1s
BENCH_ARGS             ?=
BENCH_PIN := $(if $(BENCH_SERVER_CPUS),-server-cpus $(BENCH_SERVER_CPUS)) $(if $(BENCH_CLIENT_CPUS),-client-cpus $(BENCH_CLIENT_CPUS))

BENCH_FULL_ARMS             ?= $(BENCH_ARMS)
BENCH_FULL_BATCHES          ?= 1,16,128
BENCH_FULL_CLIENTS          ?= 1,4,16,64,256
BENCH_FULL_OPEN             ?= 0.5,0.8
BENCH_FULL_WARMUP           ?= 5s
BENCH_FULL_DURATION         ?= 30s
BENCH_FULL_REPEATS          ?= 3
BENCH_FULL_CONNECTIONS      ?= 64
BENCH_FULL_FRONTENDS        ?= $(BENCH_FRONTENDS)
BENCH_FULL_PY_PROCESSES     ?= $(BENCH_PY_PROCESSES)
BENCH_FULL_PY_WORKERS       ?= $(BENCH_PY_WORKERS)
BENCH_FULL_MEMORY_ARMS      ?= $(BENCH_MEMORY_ARMS)
BENCH_FULL_MEMORY_INSTANCES ?= 1,2,4
BENCH_FULL_MEMORY_DURATION  ?= 10s
BENCH_FULL_RESULTS          ?= $(BENCH_RESULTS)/full

BENCH_SMOKE_RESULTS ?= $(BENCH_RESULTS)/ci-smoke

BENCH_PREREQS := build bench-loadgen bench-benchrun bench-py-deps $(PJRT_PLUGIN)

bench-benchrun: $(DEPS)/go.stamp
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/benchrun ./bench/cmd/benchrun

bench: $(BENCH_PREREQS) $(DEV_BUNDLE)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -bundle $(DEV_BUNDLE) -results $(BENCH_RESULTS) \
		-arms $(BENCH_ARMS) -batches $(BENCH_BATCHES) -clients $(BENCH_CLIENTS) -open '$(BENCH_OPEN)' \
		-warmup $(BENCH_WARMUP) -duration $(BENCH_DURATION) -repeats $(BENCH_REPEATS) -connections $(BENCH_CONNECTIONS) \
		-frontends $(BENCH_FRONTENDS) -py-processes $(BENCH_PY_PROCESSES) -py-workers $(BENCH_PY_WORKERS) \
		-memory-arms '$(BENCH_MEMORY_ARMS)' -memory-instances $(BENCH_MEMORY_INSTANCES) -memory-duration $(BENCH_MEMORY_DURATION) \
		$(BENCH_PIN) $(BENCH_ARGS)

bench-full: $(BENCH_PREREQS) $(BENCH_BUNDLE)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -bundle $(BENCH_BUNDLE) -results $(BENCH_FULL_RESULTS) \
		-arms $(BENCH_FULL_ARMS) -batches $(BENCH_FULL_BATCHES) -clients $(BENCH_FULL_CLIENTS) -open '$(BENCH_FULL_OPEN)' \
		-warmup $(BENCH_FULL_WARMUP) -duration $(BENCH_FULL_DURATION) -repeats $(BENCH_FULL_REPEATS) -connections $(BENCH_FULL_CONNECTIONS) \
		-frontends $(BENCH_FULL_FRONTENDS) -py-processes $(BENCH_FULL_PY_PROCESSES) -py-workers $(BENCH_FULL_PY_WORKERS) \
		-memory-arms '$(BENCH_FULL_MEMORY_ARMS)' -memory-instances $(BENCH_FULL_MEMORY_INSTANCES) -memory-duration $(BENCH_FULL_MEMORY_DURATION) \
		$(BENCH_PIN) $(BENCH_ARGS)

# CI's smoke run: the whole pipeline (start, parity, closed and open loop,
# monitor, report, bench lines) on two arms with tiny windows.
bench-smoke: $(BENCH_PREREQS) $(DEV_BUNDLE)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -bundle $(DEV_BUNDLE) -results $(BENCH_SMOKE_RESULTS) \
		-arms recmesh-full,py -batches 1,16 -clients 1,4 -open 0.8 \
		-warmup 300ms -duration 1s -repeats 1 -connections 4 -memory-arms '' \
		$(BENCH_PIN) $(BENCH_ARGS)
