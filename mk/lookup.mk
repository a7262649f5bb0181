# lookup.mk — the embedding lookup kernel (embedder/lookup):
#
#   make bench-lookup       the Go kernel and a NumPy baseline, each on one
#                           pinned core, over the 3.2 GB benchmark tables at
#                           every precision (LOOKUP_DTYPES); one `lookup:`
#                           line per precision compares them (examples per
#                           core-second), and vs_fp32 compares the Go kernel
#                           with itself on the float32 tables
#   make lookup-asm         regenerate the amd64 kernels with avo
#   make lookup-asm-check   fail if the committed assembly differs from a
#                           fresh generation
#
# Included by the root Makefile, which defines ROOT, DEPS, GO and
# BENCH_BUNDLE. The benchmarks run one after the other so their private
# copies of the tables (3.2 GB each in float32) are never in memory
# together. The bundles at other precisions are BENCH_BUNDLE-<dtype>,
# exported from the same seed, so they are the same model.

LOOKUP_DIR     := $(ROOT)/embedder/lookup
LOOKUP_RESULTS := $(ROOT)/bench/results/lookup
LOOKUP_ARGS    ?=
LOOKUP_DTYPES  ?= fp32 fp16 int8 int4

# lookup_bundle gives the benchmark bundle at precision $(1).
lookup_bundle = $(if $(filter fp32,$(1)),$(BENCH_BUNDLE),$(BENCH_BUNDLE)-$(1))

# NumPy must run single-threaded, and without the OpenBLAS tuning this
# machine's environment may set for other benchmarks.
LOOKUP_NUMPY_ENV := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	VECLIB_MAXIMUM_THREADS=1 NUMEXPR_NUM_THREADS=1

.PHONY: bench-lookup lookup-asm lookup-asm-check

# fp32 first: every other line's vs_fp32 reads its result. The lines are
# printed again together at the end, after the logs of every run.
bench-lookup: $(DEPS)/go.stamp $(DEPS)/venv.stamp $(foreach d,$(LOOKUP_DTYPES),$(call lookup_bundle,$(d))/model.safetensors)
	@mkdir -p $(LOOKUP_RESULTS)
	@rm -f $(LOOKUP_RESULTS)/lines.txt $(LOOKUP_RESULTS)/go-*.json
	$(GO) build -o $(LOOKUP_RESULTS)/lookupbench ./embedder/cmd/lookupbench
	@set -eo pipefail; for d in $(LOOKUP_DTYPES); do \
		case $$d in fp32) b=$(BENCH_BUNDLE);; *) b=$(BENCH_BUNDLE)-$$d;; esac; \
		$(LOOKUP_RESULTS)/lookupbench -bundle $$b -json $(LOOKUP_RESULTS)/go-$$d.json $(LOOKUP_ARGS); \
		base=; [ -f $(LOOKUP_RESULTS)/go-fp32.json ] && base="--go-fp32-result $(LOOKUP_RESULTS)/go-fp32.json"; \
		$(LOOKUP_NUMPY_ENV) $(DEPS)/venv/bin/python $(ROOT)/bench/numpy/lookup_bench.py \
			--bundle $$b --go-result $(LOOKUP_RESULTS)/go-$$d.json $$base | tee -a $(LOOKUP_RESULTS)/lines.txt; \
	done
	@cat $(LOOKUP_RESULTS)/lines.txt

# The benchmark tables at a precision other than float32.
$(BENCH_BUNDLE)-%/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 850000 --seed 1 --table-dtype $* --out $(BENCH_BUNDLE)-$*

lookup-asm:
	cd $(LOOKUP_DIR) && $(GO) generate .

lookup-asm-check:
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	(cd $(LOOKUP_DIR)/_generate && GOWORK=off $(GO) run . -out $$tmp/pool_amd64.s -stubs $$tmp/pool_amd64_stubs.go -pkg lookup) && \
	sed -i '1d' $$tmp/pool_amd64.s $$tmp/pool_amd64_stubs.go && \
	for f in pool_amd64.s pool_amd64_stubs.go; do \
		tail -n +2 $(LOOKUP_DIR)/$$f | diff -u - $$tmp/$$f || { echo "lookup-asm-check: $$f is stale: run make lookup-asm" >&2; exit 1; }; \
	done
