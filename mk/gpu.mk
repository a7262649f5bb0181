# gpu.mk — the GPU pack (bench/gpu, docs/gpu.md):
#
#   make gpu-pack        the pack ($(DEPS)/gpu-pack, <= 40 MiB: binaries,
#                        the Python arms, portable gRPC stubs, run.sh) and,
#                        separately, the CUDA PJRT plugin of the binding's
#                        API 0.81 from PyPI (xla-cuda13-pjrt==0.0.1)
#                        compressed into $(DEPS)/gpu-plugin; carry the two
#                        to the GPU machine one after the other (each is
#                        under its 64 MiB per transfer) and run
#                        .deps/gpu-pack/run.sh RESULTS_DIR there. Ends with
#                        `gpu-pack ok: bytes=<n> files=<k>`.
#   make gpu-rehearsal   builds the pack and runs run.sh --cpu on this
#                        machine with the CPU plugin and short windows
#                        (bench/gpu/rehearsal_test.go), so the pack cannot
#                        rot; CI runs it. Ends with `gpu-run ok: backend=cpu …`.
#
# Included by the root Makefile.

GPU_PACK       := $(DEPS)/gpu-pack
GPU_PLUGIN_DIR := $(DEPS)/gpu-plugin
GPU_PLUGIN_XZ  := $(GPU_PLUGIN_DIR)/xla_gpu_pjrt.so.xz
GPU_PLUGIN_PKG ?= xla-cuda13-pjrt==0.0.1

.PHONY: gpu-pack gpu-pack-files gpu-rehearsal

gpu-pack-files: $(DEPS)/go.stamp bench-py-deps
	bash $(ROOT)/bench/gpu/pack.sh $(GPU_PACK) $(BENCH_PY)

# The wheel is 327 MB; only its .so travels, xz-compressed (about 59 MB).
$(GPU_PLUGIN_XZ):
	rm -rf $(GPU_PLUGIN_DIR).tmp && mkdir -p $(GPU_PLUGIN_DIR).tmp
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
		--dest $(GPU_PLUGIN_DIR).tmp '$(GPU_PLUGIN_PKG)'
	cd $(GPU_PLUGIN_DIR).tmp && $(PYTHON) -m zipfile -e *.whl wheel
	so=$$(find $(GPU_PLUGIN_DIR).tmp/wheel -name 'xla_gpu_pjrt.so' | head -n 1); \
		test -n "$$so" || { echo "gpu-pack: $(GPU_PLUGIN_PKG) holds no xla_gpu_pjrt.so" >&2; exit 1; }; \
		mkdir -p $(GPU_PLUGIN_DIR) && xz -6 -T0 -c "$$so" >$@.tmp && mv $@.tmp $@
	rm -rf $(GPU_PLUGIN_DIR).tmp

gpu-pack: gpu-pack-files $(GPU_PLUGIN_XZ)
	@echo "gpu-pack: plugin $(GPU_PLUGIN_XZ) ($$(du -b $(GPU_PLUGIN_XZ) | cut -f1) bytes, carried separately)"
	@echo "gpu-pack ok: bytes=$$(du -sb $(GPU_PACK) | cut -f1) files=$$(find $(GPU_PACK) -type f | wc -l)"

gpu-rehearsal: $(DEPS)/go.stamp bench-py-deps $(PJRT_PLUGIN)
	RECMESH_GPU_REHEARSAL=1 $(GO) test -count=1 -timeout 30m -run 'TestGPURehearsal' -v ./bench/gpu/ > $(DEPS)/gpu-rehearsal.log 2>&1 || { tail -n 60 $(DEPS)/gpu-rehearsal.log; echo "gpu-rehearsal: failed (whole log in .deps/gpu-rehearsal.log)"; exit 1; }
	@grep -E '^(gpu-pack ok|parity ok|model: bucket|bench: |bench-ratio: )' $(DEPS)/gpu-rehearsal.log || true
	@grep '^gpu-run ok:' $(DEPS)/gpu-rehearsal.log
