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
#   make bench            the quick sweep (bin/benchrun) on the 3.2 GB
#                         tables, two workloads (mlperf, hostbound), every
#                         arm, B_req 1,16,128, C 1,4,16,64, open loop at 80 %
#                         of each arm's peak and at 80 % of its peak within
#                         p99 20 ms, 1 s windows, the memory check
#                         (mesh with 4 frontends vs py-mp-batch with 4
#                         processes); writes bench/results/REPORT.md (+ SVGs)
#                         and ends with the `bench:`, `bench-ratio:`,
#                         `bench-open:` and `bench-memory:` lines. Every knob is a BENCH_*
#                         variable below.
#   make bench-full       the published methodology on both workloads (C up
#                         to 256, 5 s warm-up + 30 s windows, 3 repeats;
#                         hours) into bench/results/full; knobs are
#                         BENCH_FULL_* variables
#   make bench-smoke      the CI smoke: every arm on the small bundles of
#                         both workloads, B_req 1,16, C 1,4, ~1 s windows,
#                         -strict (fails on any broken arm), into
#                         bench/results/ci-smoke (a few minutes)
#   make bench-quant      `make bench` with BENCH_TABLE_DTYPE=int8: both
#                         workloads, every arm, on int8 tables
#   make bench-smoke-quant  `make bench-smoke` with BENCH_TABLE_DTYPE=int8
#   make bench-benchrun   build bin/benchrun (bench/cmd/benchrun, a module
#                         outside the workspace: GOWORK=off)
#
# BENCH_TABLE_DTYPE (fp32, the default; fp16, int8 or int4) is the
# precision of the embedding tables every arm serves, in bench, bench-full,
# bench-smoke and bench-py-smoke: the Python arms hold the tables at that
# precision too and dequantize on the gather (bench/python/dlrm.py). At
# fp32 the bundles and results are the usual ones; at another precision
# each bundle is exported beside its fp32 one with the suffix -<dtype>
# (data/dlrm-cap850000-int8, data/dlrm-cap850000-hostbound-int8,
# data/dlrm-cap1000-int8, data/dlrm-cap1000-hostbound-int8), from the same
# seed, so it is the same model; and the results go to their own
# directories (bench/results/<dtype>, bench/results/full-<dtype>,
# bench/results/ci-smoke-<dtype>). BENCH_DENSE_DTYPE (fp32, the default;
# fp16 or bf16) is the precision of the dense weights alike: every arm
# serves the weights at that precision (the Python arms' JAX programs
# included), the bundles get the further suffix -dense-<dtype>
# (data/dlrm-cap850000-int8-dense-fp16) and the results their own
# directory. Every summary line ends with dtype=<d> dense_dtype=<d>, read by
# benchrun from the bundle's config.json.
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
BENCH_MODEL_CONFIG_PROTO := $(ROOT)/proto/inference/model_config.proto
BENCH_RESULTS  := $(BENCH_DIR)/results
BENCH_SMOKE_ARGS ?= -batch 16 -concurrency 4 -warmup 2s -duration 5s
BENCH_SERVER_CPUS ?=
BENCH_CLIENT_CPUS ?=
BENCH_SERVER_PIN := $(if $(BENCH_SERVER_CPUS),taskset -c $(BENCH_SERVER_CPUS))
BENCH_CLIENT_PIN := $(if $(BENCH_CLIENT_CPUS),-cpus $(BENCH_CLIENT_CPUS))

# The tables' precision (see the top): empty suffix at fp32, so the fp32
# bundles and results keep their names.
BENCH_TABLE_DTYPE  ?= fp32
BENCH_DENSE_DTYPE  ?= fp32
BENCH_DTYPE_SUFFIX := $(if $(filter fp32,$(BENCH_TABLE_DTYPE)),,-$(BENCH_TABLE_DTYPE))$(if $(filter fp32,$(BENCH_DENSE_DTYPE)),,-dense-$(BENCH_DENSE_DTYPE))
BENCH_EXPORT_DTYPES := --table-dtype $(BENCH_TABLE_DTYPE) --dense-dtype $(BENCH_DENSE_DTYPE)
# The small default bundle at that precision (the others are below).
BENCH_SMALL        := $(DEV_BUNDLE)$(BENCH_DTYPE_SUFFIX)

.PHONY: bench-py-deps bench-loadgen bench-py-smoke bench-benchrun bench-benchrun-vet bench-benchrun-test bench-lookupbench bench bench-full bench-smoke bench-quant bench-smoke-quant

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
# grpc_service.proto imports inference/model_config.proto (Triton's model
# configuration): it lands in $(BENCH_PYGEN)/inference/, beside the flat
# grpc_service_pb2*.py the arm imports.
$(BENCH_PYGEN)/.stamp: $(BENCH_PROTO) $(BENCH_MODEL_CONFIG_PROTO) $(BENCH_VENV)/.stamp
	rm -rf $(BENCH_PYGEN) && mkdir -p $(BENCH_PYGEN)
	$(BENCH_PY) -m grpc_tools.protoc -I $(dir $(BENCH_PROTO)) -I $(ROOT)/proto \
		--python_out=$(BENCH_PYGEN) --grpc_python_out=$(BENCH_PYGEN) $(BENCH_PROTO)
	$(BENCH_PY) -m grpc_tools.protoc -I $(ROOT)/proto --python_out=$(BENCH_PYGEN) inference/model_config.proto
	@touch $@

bench-loadgen: $(DEPS)/go.stamp
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/loadgen ./bench/cmd/loadgen

bench-py-smoke: bench-py-deps bench-loadgen $(BENCH_SMALL)/model.safetensors
	@mkdir -p $(BENCH_RESULTS)/smoke
	@set -euo pipefail; \
	out=$$(mktemp); \
	$(BENCH_SERVER_PIN) $(BENCH_PY) $(BENCH_DIR)/python/server.py --mode py --port 0 --bundle $(BENCH_SMALL) \
		--stubs $(BENCH_PYGEN) --workers 4 --warm-max 16 >$$out 2>$(BENCH_RESULTS)/smoke/py.log & \
	pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -f $$out' EXIT; \
	for i in $$(seq 240); do grep -q '^READY ' $$out && break; kill -0 $$pid || { cat $(BENCH_RESULTS)/smoke/py.log; exit 1; }; sleep 0.5; done; \
	addr=$$(awk '/^READY /{print $$2}' $$out); \
	test -n "$$addr" || { echo "bench-py-smoke: server not ready in 120 s" >&2; exit 1; }; \
	$(BIN)/loadgen parity -target $$addr -bundle $(BENCH_SMALL) $(BENCH_CLIENT_PIN); \
	$(BIN)/loadgen run -target $$addr -bundle $(BENCH_SMALL) -arm py -monitor-pids $$pid $(BENCH_CLIENT_PIN) \
		-out $(BENCH_RESULTS)/smoke/py.json $(BENCH_SMOKE_ARGS)

## The sweep driver. Pinning: BENCH_SERVER_CPUS / BENCH_CLIENT_CPUS when
## set, else benchrun's default split of the machine (2 CPUs: server 0,
## load generator 1). BENCH_ARGS adds any other benchrun flag (for example
## "-server-cpus= -client-cpus=" to pin nothing).
##
## Two workloads, both on the 3.2 GB tables (cap 850000, exported once and
## reused): `mlperf`, the MLPerf DLRMv2 dense network, and `hostbound`, the
## same tables and ids with a dense network small enough that the host's
## lookups and serving bound it (recmesh export --preset hostbound).

HOSTBOUND_BUNDLE := $(DATA)/dlrm-cap850000-hostbound
HOSTBOUND_SMALL  := $(DATA)/dlrm-cap1000-hostbound

$(HOSTBOUND_BUNDLE)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --preset hostbound --max-vocab 850000 --seed 1 --out $(HOSTBOUND_BUNDLE)

$(HOSTBOUND_SMALL)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --preset hostbound --max-vocab 1000 --seed 1 --out $(HOSTBOUND_SMALL)

# The bundles at BENCH_TABLE_DTYPE (and BENCH_SMALL, above): the ones
# above at fp32, else each exported at that precision into its own
# -<dtype> directory. These explicit rules take precedence over
# lookup.mk's pattern rule for $(BENCH_BUNDLE)-<dtype>.
BENCH_DTYPE_BUNDLE    := $(BENCH_BUNDLE)$(BENCH_DTYPE_SUFFIX)
BENCH_DTYPE_HOSTBOUND := $(HOSTBOUND_BUNDLE)$(BENCH_DTYPE_SUFFIX)
BENCH_SMALL_HOSTBOUND := $(HOSTBOUND_SMALL)$(BENCH_DTYPE_SUFFIX)

ifneq ($(BENCH_DTYPE_SUFFIX),)
$(BENCH_DTYPE_BUNDLE)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 850000 --seed 1 $(BENCH_EXPORT_DTYPES) --out $(BENCH_DTYPE_BUNDLE)

$(BENCH_DTYPE_HOSTBOUND)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --preset hostbound --max-vocab 850000 --seed 1 $(BENCH_EXPORT_DTYPES) --out $(BENCH_DTYPE_HOSTBOUND)

$(BENCH_SMALL)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 1000 --seed 1 $(BENCH_EXPORT_DTYPES) --out $(BENCH_SMALL)

$(BENCH_SMALL_HOSTBOUND)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --preset hostbound --max-vocab 1000 --seed 1 $(BENCH_EXPORT_DTYPES) --out $(BENCH_SMALL_HOSTBOUND)
endif

BENCH_WORKLOADS        ?= mlperf=$(BENCH_DTYPE_BUNDLE),hostbound=$(BENCH_DTYPE_HOSTBOUND)
BENCH_ARMS             ?= recmesh-slo,recmesh-full,recmesh-model,recmesh-none,recmesh-slo-lean,recmesh-full-lean,py,py-mp,py-mp-local,py-batch,py-mp-batch
BENCH_BATCHES          ?= 1,16,128
BENCH_CLIENTS          ?= 1,4,16,64
BENCH_OPEN             ?= 0.8
# Open loop also at fractions of each arm's peak within p99 20 ms (the
# throughput it claims), MLPerf's server scenario; `bench-open:` lines.
BENCH_OPEN_BUDGET      ?= 0.8
BENCH_WARMUP           ?= 500ms
BENCH_DURATION         ?= 1s
BENCH_REPEATS          ?= 1
BENCH_CONNECTIONS      ?= 64
# The load generator's gRPC client: lean (bench/h2client) or grpc (grpc-go).
BENCH_CLIENT           ?= lean
# Frontend processes of the recmesh and multi-process Python arms: 0 is
# one per server CPU.
BENCH_FRONTENDS        ?= 0
BENCH_PY_PROCESSES     ?= 0
BENCH_PY_WORKERS       ?= 8
BENCH_MEMORY_ARMS      ?= recmesh-slo,py-mp-batch
BENCH_MEMORY_INSTANCES ?= 1,4
BENCH_MEMORY_DURATION  ?= 1s
BENCH_ARGS             ?=
# The quick sweep's results: bench/results at fp32, bench/results/<dtype>
# at another precision.
BENCH_SWEEP_RESULTS    ?= $(BENCH_RESULTS)$(if $(BENCH_DTYPE_SUFFIX),/$(patsubst -%,%,$(BENCH_DTYPE_SUFFIX)))
BENCH_PIN := $(if $(BENCH_SERVER_CPUS),-server-cpus $(BENCH_SERVER_CPUS)) $(if $(BENCH_CLIENT_CPUS),-client-cpus $(BENCH_CLIENT_CPUS))

BENCH_FULL_WORKLOADS        ?= $(BENCH_WORKLOADS)
BENCH_FULL_ARMS             ?= $(BENCH_ARMS)
BENCH_FULL_BATCHES          ?= 1,16,128
BENCH_FULL_CLIENTS          ?= 1,4,16,64,256
BENCH_FULL_OPEN             ?= 0.5,0.8
BENCH_FULL_OPEN_BUDGET      ?= 0.8
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
BENCH_FULL_RESULTS          ?= $(BENCH_RESULTS)/full$(BENCH_DTYPE_SUFFIX)

BENCH_SMOKE_RESULTS ?= $(BENCH_RESULTS)/ci-smoke$(BENCH_DTYPE_SUFFIX)
BENCH_SMOKE_ARMS    ?= $(BENCH_ARMS)

BENCH_PREREQS := build bench-loadgen bench-benchrun bench-lookupbench bench-py-deps $(PJRT_PLUGIN)

# benchrun is a module of its own, outside the workspace (go.work): its
# charts' gonum/plot would otherwise enter every module's build graph
# (bench/cmd/benchrun/main.go says why). It is built, vetted and tested
# with GOWORK=off, its modules downloaded with the rest by `make deps`,
# and `make vet` / `make test` cover it.
BENCHRUN_DIR := $(BENCH_DIR)/cmd/benchrun

deps: $(DEPS)/go-benchrun.stamp
vet: bench-benchrun-vet
test: bench-benchrun-test

$(DEPS)/go-benchrun.stamp: $(BENCHRUN_DIR)/go.mod $(BENCHRUN_DIR)/go.sum
	@mkdir -p $(DEPS)
	cd $(BENCHRUN_DIR) && GOWORK=off $(GO) mod download
	@touch $@

bench-benchrun: $(DEPS)/go.stamp $(DEPS)/go-benchrun.stamp
	@mkdir -p $(BIN)
	cd $(BENCHRUN_DIR) && GOWORK=off $(GO) build -o $(BIN)/benchrun .

bench-benchrun-vet: $(DEPS)/go-benchrun.stamp
	cd $(BENCHRUN_DIR) && GOWORK=off $(GO) vet ./...

bench-benchrun-test: $(DEPS)/go-benchrun.stamp
	cd $(BENCHRUN_DIR) && GOWORK=off $(GO) test -count=1 ./...

bench-lookupbench: $(DEPS)/go.stamp
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/lookupbench ./embedder/cmd/lookupbench

# The quick sweep: both workloads on the 3.2 GB tables, every arm.
bench: $(BENCH_PREREQS) $(BENCH_DTYPE_BUNDLE)/model.safetensors $(BENCH_DTYPE_HOSTBOUND)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -workloads '$(BENCH_WORKLOADS)' -results $(BENCH_SWEEP_RESULTS) \
		-arms $(BENCH_ARMS) -batches $(BENCH_BATCHES) -clients $(BENCH_CLIENTS) -open '$(BENCH_OPEN)' -open-budget '$(BENCH_OPEN_BUDGET)' \
		-warmup $(BENCH_WARMUP) -duration $(BENCH_DURATION) -repeats $(BENCH_REPEATS) -connections $(BENCH_CONNECTIONS) -client $(BENCH_CLIENT) \
		-frontends $(BENCH_FRONTENDS) -py-processes $(BENCH_PY_PROCESSES) -py-workers $(BENCH_PY_WORKERS) \
		-memory-arms '$(BENCH_MEMORY_ARMS)' -memory-instances $(BENCH_MEMORY_INSTANCES) -memory-duration $(BENCH_MEMORY_DURATION) \
		$(BENCH_PIN) $(BENCH_ARGS)

bench-full: $(BENCH_PREREQS) $(BENCH_DTYPE_BUNDLE)/model.safetensors $(BENCH_DTYPE_HOSTBOUND)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -workloads '$(BENCH_FULL_WORKLOADS)' -results $(BENCH_FULL_RESULTS) \
		-arms $(BENCH_FULL_ARMS) -batches $(BENCH_FULL_BATCHES) -clients $(BENCH_FULL_CLIENTS) -open '$(BENCH_FULL_OPEN)' -open-budget '$(BENCH_FULL_OPEN_BUDGET)' \
		-warmup $(BENCH_FULL_WARMUP) -duration $(BENCH_FULL_DURATION) -repeats $(BENCH_FULL_REPEATS) -connections $(BENCH_FULL_CONNECTIONS) -client $(BENCH_CLIENT) \
		-frontends $(BENCH_FULL_FRONTENDS) -py-processes $(BENCH_FULL_PY_PROCESSES) -py-workers $(BENCH_FULL_PY_WORKERS) \
		-memory-arms '$(BENCH_FULL_MEMORY_ARMS)' -memory-instances $(BENCH_FULL_MEMORY_INSTANCES) -memory-duration $(BENCH_FULL_MEMORY_DURATION) \
		$(BENCH_PIN) $(BENCH_ARGS)

# CI's smoke run: the whole pipeline (start, parity, closed and open loop,
# monitor, dense cost, report, every line) for every arm, on the small
# bundles of both workloads with tiny windows, and the memory check at 1
# and 2 instances. -strict: any arm that fails to start, fails parity or
# fails a request fails the target.
bench-smoke: $(BENCH_PREREQS) $(BENCH_SMALL)/model.safetensors $(BENCH_SMALL_HOSTBOUND)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -workloads 'mlperf=$(BENCH_SMALL),hostbound=$(BENCH_SMALL_HOSTBOUND)' -results $(BENCH_SMOKE_RESULTS) \
		-arms $(BENCH_SMOKE_ARMS) -batches 1,16 -clients 1,4 -open 0.8 -open-budget 0.8 \
		-warmup 300ms -duration 1s -repeats 1 -connections 4 -client $(BENCH_CLIENT) \
		-memory-arms 'recmesh-slo,py-mp-batch' -memory-instances 1,2 -memory-duration 500ms -strict \
		$(BENCH_PIN) $(BENCH_ARGS)

# Both workloads, every arm, on int8 tables (bench/results/int8).
bench-quant:
	$(MAKE) bench BENCH_TABLE_DTYPE=int8

# The CI smoke on the small bundles exported at int8
# (bench/results/ci-smoke-int8): the quantized pipeline end to end, every
# arm's parity included.
bench-smoke-quant:
	$(MAKE) bench-smoke BENCH_TABLE_DTYPE=int8
