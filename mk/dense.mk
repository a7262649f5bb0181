# dense.mk — the dense network at each weight precision (model.DenseDtype):
#
#   make bench-dense   accelerator bench on one pinned core for the dev
#                      bundle at every dense precision (DENSE_DTYPES): per
#                      bucket, a `dense:` line with the bytes of weights a
#                      call reads, the stream's bandwidth (calls/s times
#                      those bytes) and the single-core copy bandwidth
#                      it is measured against (STREAM's Copy convention:
#                      bytes read plus bytes written, buffers bigger than
#                      the caches). A stream above 100 % of it is served in
#                      part from the last-level cache: the weights of the
#                      MLPerf network (61 MiB in float32) fit in some
#                      server CPUs' L3 when nothing else runs.
#
# The bundles at fp16 and bf16 are the dev bundle's seed exported with
# --dense-dtype, so all three are the same model.

DENSE_DTYPES ?= fp32 fp16 bf16
DENSE_ARGS   ?= --buckets 1,2,4,8,16,32,64,128 --duration 1s
DENSE_CPU    ?= 0

# dense_bundle gives the dev bundle at dense precision $(1).
dense_bundle = $(if $(filter fp32,$(1)),$(DEV_BUNDLE),$(DEV_BUNDLE)-dense-$(1))

$(DEV_BUNDLE)-dense-%/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --max-vocab 1000 --seed 1 --dense-dtype $* --out $(DEV_BUNDLE)-dense-$*

.PHONY: bench-dense bench-model

bench-dense: deps $(foreach d,$(DENSE_DTYPES),$(call dense_bundle,$(d))/model.safetensors)
	@mkdir -p $(DEPS)/bench-dense && rm -f $(DEPS)/bench-dense/lines.txt
	$(GO) build -o $(DEPS)/bench-dense/accelerator ./accelerator/cmd/accelerator
	@set -eo pipefail; for d in $(DENSE_DTYPES); do \
		case $$d in fp32) b=$(DEV_BUNDLE);; *) b=$(DEV_BUNDLE)-dense-$$d;; esac; \
		taskset -c $(DENSE_CPU) $(DEPS)/bench-dense/accelerator bench --bundle $$b $(DENSE_ARGS) 2>$(DEPS)/bench-dense/$$d.log \
			| tee -a $(DEPS)/bench-dense/lines.txt; \
	done

# bench-model: recmesh's compiled DCNv2 against JAX's (on the same PJRT
# plugin, and on jaxlib's own CPU backend), per bucket and dense weight
# precision (the dev bundle exported at fp32, fp16 and bf16, mk/dense.mk),
# on one core; see accelerator/jaxbench/benchmodel.py.
BENCH_MODEL_DTYPES ?= fp32 fp16 bf16
comma := ,
space := $(empty) $(empty)
BENCH_MODEL_BUNDLE ?= $(subst $(space),$(comma),$(foreach d,$(BENCH_MODEL_DTYPES),$(d)=$(call dense_bundle,$(d))))
BENCH_MODEL_ARGS   ?= --cpu 0 --buckets 1,16,128 --rounds 4 --duration 1 --jax-default-client

bench-model: deps $(foreach d,$(BENCH_MODEL_DTYPES),$(call dense_bundle,$(d))/model.safetensors)
	@mkdir -p $(DEPS)/bench-model
	$(GO) build -o $(DEPS)/bench-model/accelerator ./accelerator/cmd/accelerator
	$(DEPS)/bench-venv/bin/python accelerator/jaxbench/benchmodel.py --accelerator $(DEPS)/bench-model/accelerator \
		--bundle $(BENCH_MODEL_BUNDLE) --plugin $(PJRT_PLUGIN) $(BENCH_MODEL_ARGS)

