# recmesh — the user's interface. `make run` and `make test` are all a
# newcomer needs; every other target is reached from them or documented in
# README.md.

SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT        := $(abspath .)
DEPS        := $(ROOT)/.deps
BIN         := $(ROOT)/bin
DATA        := $(ROOT)/data
PYTHON      ?= python3
GO          ?= go
MODULES     := proto shm model telemetry frontend embedder accelerator cli bench deploy
PJRT_DIR    := $(DEPS)/pjrt
PJRT_PLUGIN := $(PJRT_DIR)/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so
VENV        := $(DEPS)/venv
VPY         := $(VENV)/bin/python
DEV_BUNDLE  := $(DATA)/dlrm-cap1000
BENCH_BUNDLE:= $(DATA)/dlrm-cap850000

export PJRT_PLUGIN_LIBRARY_PATH ?= $(dir $(PJRT_PLUGIN))
export RECMESH_PJRT_PLUGIN ?= $(PJRT_PLUGIN)

.PHONY: help deps build test vet run parity bench-model e2e e2e-steering e2e-security

help:
	@echo "make run    - start the whole mesh on the small default model"
	@echo "make test   - run every test"
	@echo "make deps   - install Go modules, the PJRT CPU plugin and the test tools"
	@echo "make build  - build every binary into bin/"
	@echo "make parity / bench-model / bench-ring / bench-lookup - see README.md"

## deps: Go modules, the PJRT CPU plugin (PyPI wheel) and a Python venv for
## the third-party protocol clients. Stamp files keep it quick when done.
deps: $(DEPS)/go.stamp $(PJRT_PLUGIN) $(DEPS)/venv.stamp

$(DEPS)/go.stamp: go.work $(wildcard */go.mod) $(wildcard */go.sum)
	@mkdir -p $(DEPS)
	@for m in $(MODULES); do (cd $$m && $(GO) mod download) || exit 1; done
	@touch $@

$(PJRT_PLUGIN):
	@mkdir -p $(PJRT_DIR)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(PJRT_DIR) xla-cpu-pjrt==0.0.1
	@test -f $@ || { echo "deps: xla-cpu-pjrt did not provide $@" >&2; exit 1; }

$(DEPS)/venv.stamp: requirements-dev.txt
	@mkdir -p $(DEPS)
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

# Go stamps the VCS revision into a binary (telemetry.Version reads it) only
# outside workspace mode unless asked; ask where there is a checkout.
BUILDVCS := $(if $(wildcard $(ROOT)/.git),-buildvcs=true)

build: $(DEPS)/go.stamp
	@mkdir -p $(BIN)
	$(GO) build $(BUILDVCS) -o $(BIN)/ ./cli/cmd/recmesh ./embedder/cmd/embedder ./accelerator/cmd/accelerator ./frontend/cmd/frontend

## run: the whole mesh on the small default model, until Ctrl-C.
run: deps build $(DEV_BUNDLE)/model.safetensors
	$(BIN)/recmesh run --bundle $(DEV_BUNDLE)

PKGS := $(foreach m,$(MODULES),./$(m)/...)
# The unit suites: every package but cli/e2e, whose multi-process suites
# (the real mesh, minutes each) make e2e runs. TEST_P packages run at once
# (go test's default, one per core: more starve the suites that start
# processes and wait for them on this 2-core machine).
UNIT_PKGS := $(filter-out ./cli/...,$(PKGS)) ./cli/cmd/... ./cli/internal/...
TEST_P    ?= 2

vet: $(DEPS)/go.stamp
	$(GO) vet $(PKGS)

test: deps vet bench-py-test
	$(GO) test -count=1 -p $(TEST_P) $(UNIT_PKGS)

## The small default bundle, exported once.
$(DEV_BUNDLE)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 1000 --seed 1 --out $(DEV_BUNDLE)

$(BENCH_BUNDLE)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 850000 --seed 1 --out $(BENCH_BUNDLE)

parity: deps $(DEV_BUNDLE)/model.safetensors
	$(GO) run ./accelerator/cmd/accelerator parity --bundle $(DEV_BUNDLE)

## e2e: the multi-process suites of cli/e2e: the mesh as real processes in
## every batching mode checked against the reference, failover, rollouts,
## the control plane, TLS, metrics, traces, SLO shedding, steering and
## Triton's client. The suites behind their own targets (chaos, abuse,
## e2e-security's whole run, e2e-steering's scaling, compose) skip here.
e2e: deps
	@rm -f $(DEPS)/e2e.summary
	RECMESH_E2E_SUMMARY=$(DEPS)/e2e.summary $(GO) test -count=1 -timeout 30m -v ./cli/e2e/ > $(DEPS)/e2e.log 2>&1 || { grep -E '^\s*--- (FAIL|PASS)' $(DEPS)/e2e.log; tail -n 60 $(DEPS)/e2e.log; echo "e2e: failed (whole log in .deps/e2e.log)"; exit 1; }
	@grep -E '^\s*(--- |e2e_test.go:[0-9]+: mode)' $(DEPS)/e2e.log || true
	@cat $(DEPS)/e2e.summary

## e2e-security: TLS and mTLS with Triton's client and certificates rotated
## under load; the control plane closed to strangers and to a frontend's
## model load; rollouts refused outside the model root and durable across
## SIGKILLed restarts. Ends with the `security ok:` line.
e2e-security: deps
	RECMESH_E2E_SECURITY=1 $(GO) test -count=1 -timeout 20m -run 'TestE2ESecurity$$' -v ./cli/e2e/ > $(DEPS)/e2e-security.log 2>&1 || { tail -n 60 $(DEPS)/e2e-security.log; echo "e2e-security: failed (whole log in .deps/e2e-security.log)"; exit 1; }
	@grep -E '^\s*(--- |security(_tls)?_test.go:[0-9]+: )' $(DEPS)/e2e-security.log || true
	@grep '^security ok:' $(DEPS)/e2e-security.log

## e2e-steering: frontends scaled 2 → 5 → 2 under churning load, with eBPF
## steering and with the kernel's hash (docs/deployment.md); ends with the
## steering ok line. First, a frontend's steering as compose runs it: another
## user than root with CAP_BPF its only capability, on a root-only bpffs.
## Needs root (to mount bpffs, at /sys/fs/bpf when missing, and to start
## processes as other users).
e2e-steering: deps
	@mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || echo "e2e-steering: could not mount bpffs at /sys/fs/bpf"
	RECMESH_REQUIRE_EBPF=1 $(GO) test -count=1 -run 'TestOpenWithOnlyCAPBPF' -v ./frontend/steering/ > $(DEPS)/e2e-steering-privilege.log 2>&1 || { tail -n 30 $(DEPS)/e2e-steering-privilege.log; echo "e2e-steering: least privilege failed (whole log in .deps/e2e-steering-privilege.log)"; exit 1; }
	@grep -E '^\s*--- ' $(DEPS)/e2e-steering-privilege.log
	RECMESH_E2E_STEERING=1 RECMESH_REQUIRE_EBPF=1 $(GO) test -count=1 -timeout 20m -run 'TestE2ESteering' -v ./cli/e2e/ > $(DEPS)/e2e-steering.log 2>&1 || { tail -n 60 $(DEPS)/e2e-steering.log; echo "e2e-steering: failed (whole log in .deps/e2e-steering.log)"; exit 1; }
	@grep -E '^\s*(--- |steering_test.go:[0-9]+: (ebpf|kernel-hash|mean))' $(DEPS)/e2e-steering.log || true
	@grep '^steering ok:' $(DEPS)/e2e-steering.log

## bench-py-test: the Python arms' own unit tests (bench/python/test_*.py).
bench-py-test: bench-py-deps
	$(BENCH_PY) -m unittest discover -s bench/python -p 'test_*.py'

-include mk/*.mk
