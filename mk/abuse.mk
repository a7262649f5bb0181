# abuse.mk — make e2e-abuse: what a client may cost a frontend, and what a
# compromised frontend can do (docs/security.md). Against the real mesh,
# one frontend per transport (grpc and lean), honest clients calling both
# throughout with every score checked:
#
#   a CPU hog (6 × the CPU count busy loops for ABUSE_HOG_SECONDS) beside
#   the mesh: no process may be declared dead, no honest UNAVAILABLE;
#   a hostile frontend on the shared-memory broker: spoofed pids, the
#   accelerator's role asked for, lanes hoarded;
#   per transport: a deadline and cancellation storm, rapid reset, an HPACK
#   bomb, a CONTINUATION flood, unfinished bodies, 1,000 dribbling
#   connections, huge length prefixes; h2spec on the lean transport.
#
# After each attack every frontend must serve correct scores again within
# 10 s, and none may pass 256 MiB of RSS. Ends with the `abuse ok:` line.
# ABUSE_ATTACKS (a comma list of attack names: cpu_hog, hostile_frontend,
# deadline_storm, rapid_reset, hpack_bomb, continuation_flood,
# unfinished_bodies, dribble, huge_prefix, h2spec) runs only those and
# ends with an `abuse partial:` line instead.

ABUSE_HOG_SECONDS ?= 180
ABUSE_ATTACKS     ?=

.PHONY: e2e-abuse

e2e-abuse: deps
	RECMESH_E2E_ABUSE=1 RECMESH_ABUSE_HOG_SECONDS=$(ABUSE_HOG_SECONDS) RECMESH_ABUSE_ATTACKS=$(ABUSE_ATTACKS) \
		$(GO) test -count=1 -timeout 20m -run 'TestE2EAbuse$$' -v ./cli/e2e/ > $(DEPS)/e2e-abuse.log 2>&1 || { \
		grep -E '^\s*(--- |abuse(_[a-z0-9]+)?_test.go:[0-9]+: )' $(DEPS)/e2e-abuse.log; \
		echo "e2e-abuse: failed (whole log in .deps/e2e-abuse.log)"; exit 1; }
	@grep -E '^\s*(--- |abuse_test.go:[0-9]+: abuse)' $(DEPS)/e2e-abuse.log || true
	@grep -E '$(if $(ABUSE_ATTACKS),^abuse (ok|partial):,^abuse ok:)' $(DEPS)/e2e-abuse.log
