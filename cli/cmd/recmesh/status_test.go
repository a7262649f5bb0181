package main

import (
	"strings"
	"testing"

	"github.com/recmesh/recmesh/proto/control"
)

// TestStatus: every process that answers within --collect is listed, and
// the switch --wait of the update commands, set for them in the
// environment, does not reach it.
func TestStatus(t *testing.T) {
	s := startNATS(t, control.RoleAdmin)
	vars := map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_WAIT": "true", "RECMESH_COLLECT": "100ms"}
	if code, _, stderr := runT(t, vars, "status"); code != exitFailure || !strings.Contains(stderr, "within 100ms") {
		t.Errorf("with nothing to answer: exit %d, %q", code, stderr)
	}
	fe := connect(t, s, control.RoleFrontend)
	if _, err := control.Register(fe, control.ServiceFrontend, "v1.0.0", func() control.Status { return control.Status{State: "ready"} }); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runT(t, vars, "status", "--collect", "2s")
	if code != exitOK || !strings.Contains(stdout, "frontend") || !strings.Contains(stdout, "ready") {
		t.Errorf("with a frontend: exit %d, %q %q", code, stdout, stderr)
	}
}
