# fullsize.mk — the full-size MLPerf DLRMv2 tables on one host:
#
#   make bench-full-size   all 204,184,588 rows of model.FullVocabSizes
#                          (--max-vocab 0) at int4, 13.9 GB, exported once
#                          into data/dlrm-full-int4-hostbound (about 2
#                          minutes, streamed: the exporter never holds a
#                          table), served by the mesh (recmesh-slo) with
#                          the hostbound dense network on the server CPU;
#                          parity checked on sampled examples against the
#                          reference regenerated from the seed (no second
#                          copy of the tables is read); closed loop at
#                          B_req 1, 16 and 128; then every Python arm whose
#                          private table copies fit in the memory available
#                          (one that does not is reported as not started
#                          for lack of memory, never run into the OOM
#                          killer). Ends with
#   full-size: dtype=int4 rows=204184588 table_gib=<t> mesh_pss_gib=<p> parity_max_abs_diff=<d> b1=<ex/s> b16=<ex/s> b128=<ex/s> python=<best ex/s at b16 or did-not-fit>
#                          (b<N>: the mesh's best examples/s with p99 ≤
#                          20 ms; mesh_pss_gib: its largest PSS, the whole
#                          process tree, over the sweep). Results and
#                          REPORT.md in bench/results/full-size. Needs
#                          about 15 GiB of memory for the mesh and 14 GB
#                          of disk.
#
# The bundle is the hostbound preset: the same tables as the MLPerf
# preset's at that seed (every table row is drawn from its own counter,
# whatever the dense network), with the dense network the host's lookups
# outweigh, so the figures are the tables'. FULL_SIZE_DTYPE picks another
# precision (its bundle beside: data/dlrm-full-<dtype>-hostbound); at fp16
# and fp32 the tables do not fit a 24 GiB host.
#
# Included by the root Makefile, which defines DATA, GO and BIN; the
# prerequisites and pinning are bench.mk's.

FULL_SIZE_DTYPE    ?= int4
FULL_SIZE_BUNDLE   := $(DATA)/dlrm-full-$(FULL_SIZE_DTYPE)-hostbound
FULL_SIZE_RESULTS  ?= $(BENCH_RESULTS)/full-size
FULL_SIZE_ARMS     ?= recmesh-slo,py,py-batch,py-mp,py-mp-batch,py-mp-local
FULL_SIZE_CLIENTS  ?= 1,4,16,64
FULL_SIZE_WARMUP   ?= 3s
FULL_SIZE_DURATION ?= 10s
FULL_SIZE_ARGS     ?=

.PHONY: bench-full-size

$(FULL_SIZE_BUNDLE)/model.safetensors: | $(DEPS)/go.stamp
	$(GO) run ./cli/cmd/recmesh export --preset hostbound --max-vocab 0 --seed 1 --table-dtype $(FULL_SIZE_DTYPE) --out $(FULL_SIZE_BUNDLE)

bench-full-size: $(BENCH_PREREQS) $(FULL_SIZE_BUNDLE)/model.safetensors
	$(BIN)/benchrun -root $(ROOT) -bin $(BIN) -workloads 'full-size=$(FULL_SIZE_BUNDLE)' -results $(FULL_SIZE_RESULTS) \
		-arms $(FULL_SIZE_ARMS) -batches 1,16,128 -clients $(FULL_SIZE_CLIENTS) -open '' -open-budget '' \
		-warmup $(FULL_SIZE_WARMUP) -duration $(FULL_SIZE_DURATION) -repeats 1 -connections 64 -client $(BENCH_CLIENT) \
		-memory-arms '' -dense-cost=false -generated-reference -full-size \
		$(BENCH_PIN) $(FULL_SIZE_ARGS)
