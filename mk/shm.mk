# shm: the shared-memory transport's benchmark and fuzz targets. Included by
# the root Makefile (-include mk/*.mk), which defines ROOT and GO.

.PHONY: bench-ring bench-ring-go fuzz-shm

## bench-ring: two real processes ping-pong over one lane (both spinning),
## then stream with every slot in flight. The last line is
## "ring: round_trip_p50_us=<x> round_trip_p99_us=<y> msgs_per_s=<z>".
bench-ring: $(DEPS)/go.stamp
	@$(GO) run ./shm/cmd/ringbench

## bench-ring-go: the in-process go benchmarks, with allocations per message.
bench-ring-go: $(DEPS)/go.stamp
	$(GO) test -run=NONE -bench=. -benchmem ./shm/

## fuzz-shm: every shm fuzz target for SHM_FUZZTIME each, one invocation per
## target (go test -fuzz takes one at a time). Minimisation of new inputs is
## capped so it does not eat the whole budget. The budget is an execution
## count (at most about 10 s per target on a 2-core CI machine): a duration
## can fail a clean run under Go 1.26 (see FUZZTIME in mk/robust.mk).
SHM_FUZZTIME ?= 50000x
SHM_FUZZ     := FuzzAttachHeader FuzzSharedMemory FuzzRecords
fuzz-shm: $(DEPS)/go.stamp
	@for f in $(SHM_FUZZ); do \
		echo "fuzz-shm: $$f for $(or $(FUZZTIME),$(SHM_FUZZTIME))"; \
		$(GO) test -run=NONE -fuzz="^$$f\$$" -fuzztime=$(or $(FUZZTIME),$(SHM_FUZZTIME)) -fuzzminimizetime=2s ./shm/ || exit 1; \
	done
