package main

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/proto/control"
)

// statusEmbedder answers status as an embedder with updates (nil: updates
// off) and, given a hash reply, the tables hash; it counts hash requests.
func statusEmbedder(t *testing.T, s *meshnats.Server, u *control.UpdatesStatus, hash *control.TablesHashReply) *atomic.Int32 {
	t.Helper()
	nc := connect(t, s, control.RoleEmbedder)
	svc, err := control.Register(nc, control.ServiceEmbedder, "v1.0.0", func() control.Status {
		return control.Status{State: "ready", Ready: true, ModelID: "m1", Updates: u}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	var asked atomic.Int32
	if hash != nil {
		if _, err := nc.Subscribe(control.SubjectTablesHash, func(m *nats.Msg) {
			asked.Add(1)
			b, _ := json.Marshal(hash)
			_ = m.Respond(b)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &asked
}

// TestUpdateStatus: one line from the embedder's updates status, the
// tables hash appended with --hash.
func TestUpdateStatus(t *testing.T) {
	s := startNATS(t, control.RoleAdmin)
	// A frontend answers status too, and is not an embedder.
	fe := connect(t, s, control.RoleFrontend)
	if _, err := control.Register(fe, control.ServiceFrontend, "v1.0.0", func() control.Status { return control.Status{State: "ready"} }); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"NATS_URL": s.ClientURL()}
	if code, _, stderr := runT(t, vars, "update", "status"); code != exitFailure || !strings.Contains(stderr, "no embedder answered") {
		t.Errorf("without an embedder: exit %d, %q", code, stderr)
	}

	u := &control.UpdatesStatus{Subject: "recmesh.updates.rows.m1", Base: 3, Applied: 42, Pending: 7, LagSeconds: 0.0125,
		Rows: 40960, Refused: 1, CaughtUp: true, Consumer: "embedder-m1-pod-a"}
	asked := statusEmbedder(t, s, u, &control.TablesHashReply{Applied: 42, Hash: "00ff"})
	const want = "updates: model=m1 subject=recmesh.updates.rows.m1 base=3 applied=42 pending=7 lag_s=0.013 rows_applied=40960 refused=1 caught_up=true consumer=embedder-m1-pod-a"
	code, stdout, stderr := runT(t, vars, "update", "status")
	if code != exitOK || stdout != want+"\n" {
		t.Errorf("exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
	}
	if asked.Load() != 0 {
		t.Error("the tables hash was asked for without --hash")
	}
	code, stdout, stderr = runT(t, vars, "update", "status", "--hash")
	if code != exitOK || stdout != want+" tables_hash=00ff\n" {
		t.Errorf("--hash: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if asked.Load() != 1 {
		t.Errorf("the tables hash was asked for %d times, want once", asked.Load())
	}
	// The environment twin works as the flag does.
	if code, stdout, _ := runT(t, map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_HASH": "true"}, "update", "status"); code != exitOK || !strings.HasSuffix(stdout, " tables_hash=00ff\n") {
		t.Errorf("RECMESH_HASH=true: exit %d, stdout %q", code, stdout)
	}
}

// TestUpdateStatusHashLater: a hash taken after updates the status had not
// seen yet says at which sequence it was taken; an embedder's error is
// shown.
func TestUpdateStatusHashLater(t *testing.T) {
	s := startNATS(t, control.RoleAdmin)
	statusEmbedder(t, s, &control.UpdatesStatus{Subject: "recmesh.updates.rows.m1", Applied: 5, Error: "stream gone"},
		&control.TablesHashReply{Applied: 6, Hash: "ab"})
	code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status", "--hash")
	if code != exitOK || !strings.HasSuffix(stdout, ` caught_up=false error="stream gone" tables_hash=ab hash_applied=6`+"\n") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestUpdateStatusErrors: an embedder with updates off, a hash the
// embedder cannot give, and an identity that may not ask for it are
// errors that say so, at once.
func TestUpdateStatusErrors(t *testing.T) {
	t.Run("updates off", func(t *testing.T) {
		s := startNATS(t, control.RoleAdmin)
		statusEmbedder(t, s, nil, nil)
		code, _, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status")
		if code != exitFailure || !strings.Contains(stderr, "row updates are off") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("hash error", func(t *testing.T) {
		s := startNATS(t, control.RoleAdmin)
		statusEmbedder(t, s, &control.UpdatesStatus{Subject: "recmesh.updates.rows.m1"}, &control.TablesHashReply{Error: "tables are being replaced"})
		code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status", "--hash")
		if code != exitFailure || stdout != "" || !strings.Contains(stderr, "the embedder: tables are being replaced") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
	t.Run("no hash answer", func(t *testing.T) {
		s := startNATS(t, control.RoleAdmin)
		statusEmbedder(t, s, &control.UpdatesStatus{Subject: "recmesh.updates.rows.m1"}, nil)
		code, _, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status", "--hash")
		if code != exitFailure || !strings.Contains(stderr, "no embedder answers "+control.SubjectTablesHash) {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("trainer may not hash", func(t *testing.T) {
		s := startNATS(t, control.RoleTrainer)
		statusEmbedder(t, s, &control.UpdatesStatus{Subject: "recmesh.updates.rows.m1"}, &control.TablesHashReply{Hash: "00"})
		// The trainer may see the status (push --wait reads it)...
		if code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status"); code != exitOK || !strings.HasPrefix(stdout, "updates: model=m1") {
			t.Errorf("trainer's status: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		// ...not make the embedder read every byte of its tables.
		start := time.Now()
		code, _, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()}, "update", "status", "--hash")
		if code != exitFailure || !strings.Contains(stderr, "refused this identity") {
			t.Errorf("trainer's --hash: exit %d, stderr %q; want a refusal", code, stderr)
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("the refusal took %v, not at once", took)
		}
	})
}

// TestUpdateHelp: the subcommands are listed and their flags have
// environment twins; recmesh run names its JetStream directory's.
func TestUpdateHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"update", "help"}, []string{"push ", "status "}},
		{[]string{"update", "push", "-h"}, []string{"-rows file", "RECMESH_ROWS", "-random N", "RECMESH_PER_MESSAGE", "-wait", "RECMESH_NATS_URL"}},
		{[]string{"update", "status", "-h"}, []string{"-hash", "RECMESH_HASH"}},
		{[]string{"run", "-h"}, []string{"-jetstream-dir dir", "RECMESH_JETSTREAM_DIR", "<model root>/.jetstream"}},
	} {
		code, stdout, stderr := runT(t, nil, tc.args...)
		for _, w := range tc.want {
			if code != exitOK || !strings.Contains(stdout, w) {
				t.Errorf("recmesh %v: exit %d, stdout %q, stderr %q; want %q", tc.args, code, stdout, stderr, w)
			}
		}
	}
	if code, _, stderr := runT(t, nil, "update", "frob"); code != exitUsage || !strings.Contains(stderr, `unknown update subcommand "frob"`) {
		t.Errorf("update frob: exit %d, %q", code, stderr)
	}
}

// TestRunModelRoot: recmesh run's JetStream default follows the model root
// its processes use.
func TestRunModelRoot(t *testing.T) {
	e := &env{getenv: func(string) string { return "" }}
	if got := runModelRoot(e, "data/dlrm-cap1000"); got != "data" {
		t.Errorf("model root %q, want the bundle's directory", got)
	}
	e.getenv = func(k string) string {
		if k == "RECMESH_MODEL_ROOT" {
			return "/models"
		}
		return ""
	}
	if got := runModelRoot(e, "data/dlrm-cap1000"); got != "/models" {
		t.Errorf("model root %q, want RECMESH_MODEL_ROOT", got)
	}
}
