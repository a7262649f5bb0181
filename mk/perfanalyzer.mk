# perfanalyzer.mk — Triton's load generator, perf_analyzer, against the mesh.
#
#   make perf-analyzer   start the mesh on the dev bundle, run perf_analyzer
#                        at B = 1 and 16 (zero inputs and the shipped
#                        bench/perfanalyzer/inputs.json), print
#                        `perf-analyzer ok: b=1 … ; b=16 …`
#
# perf_analyzer ships inside the tritonclient 2.50.0 wheel (later wheels
# need a newer glibc than Debian 12's); it links libb64 (Debian's
# libb64-0d) and the CUDA runtime (PyPI's nvidia-cuda-runtime-cu12; no GPU
# is used). Everything installs into its own venv under $(DEPS).
#
# Included by the root Makefile, which defines ROOT, DEPS, BIN, PYTHON and
# DEV_BUNDLE.

PERF_VENV          := $(DEPS)/perf-venv
PERF_ANALYZER      := $(PERF_VENV)/bin/perf_analyzer
PERF_TRITONCLIENT  := 2.50.0
PERF_CUDA_RUNTIME  := 12.9.79
PERF_CUDART_DIR     = $(PERF_VENV)/lib/python3.11/site-packages/nvidia/cuda_runtime/lib
PERF_STAMP         := $(PERF_VENV)/.tritonclient-$(PERF_TRITONCLIENT)

.PHONY: perf-analyzer perf-analyzer-deps

perf-analyzer-deps: $(PERF_STAMP)

$(PERF_STAMP):
	@dpkg -s libb64-0d >/dev/null 2>&1 || { \
		echo "installing Debian's libb64-0d for perf_analyzer"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null; }
	rm -rf $(PERF_VENV)
	$(PYTHON) -m venv $(PERF_VENV)
	$(PERF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		"tritonclient[grpc]==$(PERF_TRITONCLIENT)" "nvidia-cuda-runtime-cu12==$(PERF_CUDA_RUNTIME)"
	@test -x $(PERF_ANALYZER) || { echo "perf-analyzer: the tritonclient wheel brought no perf_analyzer" >&2; exit 1; }
	@touch $@

perf-analyzer: build $(DEV_BUNDLE)/model.safetensors $(PERF_STAMP)
	$(ROOT)/bench/perfanalyzer/run.sh $(PERF_ANALYZER) $(PERF_CUDART_DIR) $(BIN) $(DEV_BUNDLE) $(DEPS)/perf-analyzer
