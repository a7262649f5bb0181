# lookup.mk — the embedding lookup kernel (embedder/lookup):
#
#   make bench-lookup       the Go kernel and a NumPy baseline, each on one
#                           pinned core, over the 3.2 GB benchmark tables; the
#                           last line compares them (examples per core-second)
#   make lookup-asm         regenerate the amd64 kernels with avo
#   make lookup-asm-check   fail if the committed assembly differs from a
#                           fresh generation
#
# Included by the root Makefile, which defines ROOT, DEPS, GO and
# BENCH_BUNDLE. The two benchmarks run one after the other so their private
# copies of the tables (3.2 GB each) are never in memory together.

LOOKUP_DIR     := $(ROOT)/embedder/lookup
LOOKUP_RESULTS := $(ROOT)/bench/results/lookup
LOOKUP_ARGS    ?=

# NumPy must run single-threaded, and without the OpenBLAS tuning this
# machine's environment may set for other benchmarks.
LOOKUP_NUMPY_ENV := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
	VECLIB_MAXIMUM_THREADS=1 NUMEXPR_NUM_THREADS=1

.PHONY: bench-lookup lookup-asm lookup-asm-check

bench-lookup: $(DEPS)/go.stamp $(DEPS)/venv.stamp $(BENCH_BUNDLE)/model.safetensors
	@mkdir -p $(LOOKUP_RESULTS)
	$(GO) run ./embedder/cmd/lookupbench -bundle $(BENCH_BUNDLE) -json $(LOOKUP_RESULTS)/go.json $(LOOKUP_ARGS)
	$(LOOKUP_NUMPY_ENV) $(DEPS)/venv/bin/python $(ROOT)/bench/numpy/lookup_bench.py \
		--bundle $(BENCH_BUNDLE) --go-result $(LOOKUP_RESULTS)/go.json

lookup-asm:
	cd $(LOOKUP_DIR) && $(GO) generate .

lookup-asm-check:
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	(cd $(LOOKUP_DIR)/_generate && GOWORK=off $(GO) run . -out $$tmp/pool_amd64.s -stubs $$tmp/pool_amd64_stubs.go -pkg lookup) && \
	sed -i '1d' $$tmp/pool_amd64.s $$tmp/pool_amd64_stubs.go && \
	for f in pool_amd64.s pool_amd64_stubs.go; do \
		tail -n +2 $(LOOKUP_DIR)/$$f | diff -u - $$tmp/$$f || { echo "lookup-asm-check: $$f is stale: run make lookup-asm" >&2; exit 1; }; \
	done
