# accuracy.mk — MLPerf's accuracy rule for the table and dense precisions
# (cli/cmd/accuracy), on synthetic labels:
#
#   make bench-accuracy        1,000,000 examples drawn as the benchmark
#                              draws them (model.RandomInputs, seed 1) on
#                              the benchmark's tables (hostbound preset, cap
#                              850000, weight seed 1), scored with the
#                              tables at fp32, fp16, int8 and int4, each
#                              with the dense weights at fp32, fp16 and
#                              bf16 (twelve combinations); labels drawn once
#                              (seed 1) from the scores of fp32 tables with
#                              fp32 dense weights through a calibration that
#                              gives them an AUC of 0.80 ± 0.01; exact AUC
#                              (ties count half). One line per combination,
#                              fp32/fp32 first, then each table precision's
#                              dense precisions in turn:
#                                accuracy: dtype=<d> dense_dtype=<dd> examples=<n> auc=<a> fp32_auc=<f> auc_ratio=<a/f> max_abs_diff=<m> mean_abs_diff=<e>
#                              (dtype: the tables'; max/mean_abs_diff: scores
#                              against fp32/fp32's). Fails when a
#                              combination with int4 tables is below 99 % of
#                              float32's AUC, or any other below 99.9 %
#                              (MLPerf's targets). A few minutes here; 3.2 GB
#                              of tables in memory at a time.
#   make bench-accuracy-short  the CI form: 100,000 examples on the cap
#                              100000 tables, the same twelve lines and
#                              targets, in well under a minute (each table
#                              precision's examples are pooled once and run
#                              through the three dense networks, so the dense
#                              precisions add about half to the time of
#                              scoring the tables alone; -dense-dtypes fp32
#                              in ACCURACY_ARGS leaves them out).
#
# No bundle is read: every weight is regenerated from its seed exactly as
# recmesh export draws it (model.NewGeneratedReference), so no precision's
# bundle needs exporting first. ACCURACY_ARGS adds flags to both (see
# `go run ./cli/cmd/accuracy -h`: -preset, -max-vocab, -examples, -seed,
# -input-seed, -label-seed, -dtypes, -dense-dtypes, -table-memory-mib).
#
# Included by the root Makefile, which defines ROOT, DEPS and GO.

ACCURACY_ARGS ?=
ACCURACY_BIN  := $(DEPS)/accuracy/accuracy

.PHONY: bench-accuracy bench-accuracy-short accuracy-build

accuracy-build: $(DEPS)/go.stamp
	@mkdir -p $(dir $(ACCURACY_BIN))
	$(GO) build -o $(ACCURACY_BIN) ./cli/cmd/accuracy

bench-accuracy: accuracy-build
	$(ACCURACY_BIN) -examples 1000000 -max-vocab 850000 $(ACCURACY_ARGS)

bench-accuracy-short: accuracy-build
	$(ACCURACY_BIN) -examples 100000 -max-vocab 100000 $(ACCURACY_ARGS)
