# robust.mk — the checks that no client or peer can hurt the mesh:
#
#   make test-race       go test -race on the packages with concurrency
#                        (shm, frontend, embedder, the accelerator's server,
#                        the control plane)
#   make fuzz-frontend   the OIP request decoder under the fuzzer for
#                        FUZZTIME (FuzzModelInferRequest)
#   make fuzz            fuzz-shm and fuzz-frontend
#
# Included by the root Makefile; CI runs test-race and fuzz briefly.

FUZZTIME  ?= 10s
RACE_PKGS := ./shm/... ./frontend/... ./embedder/... ./accelerator/server/... ./proto/control/...

.PHONY: test-race fuzz fuzz-frontend

test-race: $(DEPS)/go.stamp
	$(GO) test -race -count=1 $(RACE_PKGS)

fuzz-frontend: $(DEPS)/go.stamp
	$(GO) test -run=NONE -fuzz='^FuzzModelInferRequest$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=2s ./frontend/

fuzz: fuzz-shm fuzz-frontend
