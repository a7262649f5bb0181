# accuracy.mk — MLPerf's accuracy rule for the table precisions
# (cli/cmd/accuracy), on synthetic labels:
#
#   make bench-accuracy        1,000,000 examples drawn as the benchmark
#                              draws them (model.RandomInputs, seed 1) on
#                              the benchmark's tables (hostbound preset, cap
#                              850000, weight seed 1), scored at fp32, fp16,
#                              int8 and int4; labels drawn once (seed 1)
#                              from float32's scores through a calibration
#                              that gives float32 an AUC of 0.80 ± 0.01;
#                              exact AUC (ties count half). One line per
#                              precision, fp32 first:
#                                accuracy: dtype=<d> examples=<n> auc=<a> fp32_auc=<f> auc_ratio=<a/f> max_abs_diff=<m> mean_abs_diff=<e>
#                              (max/mean_abs_diff: scores against fp32's).
#                              Fails when fp16 or int8 is below 99.9 % of
#                              float32's AUC or int4 below 99 % (MLPerf's
#                              targets). A few minutes here; 3.2 GB of
#                              tables in memory at a time.
#   make bench-accuracy-short  the CI form: 100,000 examples on the cap
#                              100000 tables, the same lines and targets,
#                              in well under a minute.
#
# No bundle is read: every weight is regenerated from its seed exactly as
# recmesh export draws it (model.NewGeneratedReference), so no precision's
# bundle needs exporting first. ACCURACY_ARGS adds flags to both (see
# `go run ./cli/cmd/accuracy -h`: -preset, -max-vocab, -examples, -seed,
# -input-seed, -label-seed, -dtypes, -table-memory-mib).
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
