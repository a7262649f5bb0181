package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/proto/control"
)

// TestModelSnapshot runs recmesh model snapshot against a fake embedder on
// a real NATS server: the request names the directory, the reply's bundle
// and sequence are printed, and the embedder's refusal is the command's
// error.
func TestModelSnapshot(t *testing.T) {
	ns, err := meshnats.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	roleEnv := func(role control.Role) func(string) string {
		m := map[string]string{}
		for _, kv := range ns.Env(role) {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return func(k string) string { return m[k] }
	}
	emb := roleEnv(control.RoleEmbedder)
	opt, err := nats.NkeyOptionFromSeed(emb(control.EnvNkey))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(emb("NATS_URL"), opt)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var asked []string
	sub, err := nc.Subscribe(control.SubjectSnapshot, func(m *nats.Msg) {
		var req control.SnapshotRequest
		_ = json.Unmarshal(m.Data, &req)
		asked = append(asked, req.Out)
		rep := control.SnapshotReply{Bundle: "/root/" + req.Out, ModelID: "m1", UpdatesSeq: 41}
		if req.Out == "exists" {
			rep = control.SnapshotReply{Error: "model: bundle exists already exists; name a new directory"}
		}
		b, _ := json.Marshal(rep)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// control.Dial takes the identity from the process environment.
	t.Setenv(control.EnvNkey, roleEnv(control.RoleAdmin)(control.EnvNkey))
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: roleEnv(control.RoleAdmin), isTerminal: func(io.Writer) bool { return false }}
	if code := run(context.Background(), []string{"model", "snapshot", "--out", "snap1"}, e); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if got, want := out.String(), "snapshot: bundle=/root/snap1 model=m1 updates_seq=41\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"model", "snapshot", "--out", "exists"}, e); code != exitFailure || !strings.Contains(errOut.String(), "already exists") {
		t.Errorf("refused snapshot: exit %d, %q", code, errOut.String())
	}
	if code := run(context.Background(), []string{"model", "snapshot"}, e); code != exitUsage {
		t.Errorf("snapshot without --out: exit %d, want %d", code, exitUsage)
	}
	if len(asked) != 2 || asked[0] != "snap1" {
		t.Errorf("embedder asked for %v", asked)
	}
}
