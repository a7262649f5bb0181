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

.PHONY: bench-py-deps bench-loadgen bench-py-smoke

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
