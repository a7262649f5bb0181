package meshnats

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/proto/control"
)

func connectAs(t *testing.T, url string, ids *Identities, role control.Role, errs chan<- error) *nats.Conn {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(ids.Seed(role))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errs != nil {
			select {
			case errs <- err:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestRolesOnARealServer checks the closed default with real clients: no
// identity, no connection; a frontend cannot reach model.load; the
// services still answer status, discovery and the rollout's prepare.
func TestRolesOnARealServer(t *testing.T) {
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	checkRoles(t, s.ClientURL(), s.Identities)
}

// TestGeneratedConfig starts a server from the configuration file Generate
// writes (what docker compose's NATS runs with) and checks the same.
func TestGeneratedConfig(t *testing.T) {
	store := filepath.Join(t.TempDir(), "jetstream")
	ids, err := Generate(t.TempDir(), store)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(ids.Dir, ServerDir, ConfigFile))
	if err != nil {
		t.Fatalf("NATS cannot read the generated %s: %v", ConfigFile, err)
	}
	if !opts.JetStream || opts.StoreDir != store {
		t.Errorf("the generated %s runs JetStream %v in %q; want it on, in %s", ConfigFile, opts.JetStream, opts.StoreDir, store)
	}
	opts.Host, opts.Port, opts.NoSigs, opts.NoLog = "127.0.0.1", server.RANDOM_PORT, true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server from the generated config did not start")
	}
	checkRoles(t, ns.ClientURL(), ids)
	checkJetStream(t, ns.ClientURL(), ids)
}

// TestGeneratedConfigWithoutJetStream: no store directory, no JetStream
// (and nothing else changes).
func TestGeneratedConfigWithoutJetStream(t *testing.T) {
	ids, err := Generate(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(ids.Dir, ServerDir, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if opts.JetStream || len(opts.Nkeys) != len(control.Roles) {
		t.Errorf("JetStream %v, %d users; want off and one user per role", opts.JetStream, len(opts.Nkeys))
	}
}

func checkRoles(t *testing.T, url string, s *Identities) {
	for _, role := range control.Roles {
		st, err := os.Stat(s.Seed(role))
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if role == control.RoleFrontend {
			want = 0o640 // frontends may run as another user in the mesh's group
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s seed file mode %v, want %v", role, st.Mode().Perm(), want)
		}
	}

	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("unauthenticated connect: %v; want an authorization error", err)
	}

	embedder := connectAs(t, url, s, control.RoleEmbedder, nil)
	var loads atomic.Int32
	if _, err := embedder.Subscribe(control.SubjectModelLoad, func(m *nats.Msg) {
		loads.Add(1)
		_ = m.Respond([]byte(`{"generation":2,"model_id":"m"}`))
	}); err != nil {
		t.Fatal(err)
	}
	accelerator := connectAs(t, url, s, control.RoleAccelerator, nil)
	if _, err := accelerator.Subscribe(control.SubjectPrepare, func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"model_id":"m"}`))
	}); err != nil {
		t.Fatal(err)
	}
	frontendErrs := make(chan error, 4)
	frontend := connectAs(t, url, s, control.RoleFrontend, frontendErrs)
	if _, err := control.Register(frontend, control.ServiceFrontend, "v1.0.0", func() control.Status {
		return control.Status{State: "ready", Ready: true}
	}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{embedder, accelerator, frontend} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The embedder may ask the accelerator to prepare.
	if _, err := control.Call(ctx, embedder, control.SubjectPrepare, control.LoadRequest{Bundle: "v2"}); err != nil {
		t.Errorf("embedder → prepare: %v", err)
	}
	// A frontend may not load a model: the publish is refused.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	_, err := control.Call(short, frontend, control.SubjectModelLoad, control.LoadRequest{Bundle: "/etc"})
	cancelShort()
	if err == nil {
		t.Error("a frontend's model load was answered")
	}
	select {
	case perr := <-frontendErrs:
		if !errors.Is(perr, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(perr.Error()), "permissions violation") {
			t.Errorf("frontend's error %v is not a permissions violation", perr)
		}
	case <-time.After(5 * time.Second):
		t.Error("the server reported no permissions violation for the frontend's model load")
	}
	if n := loads.Load(); n != 0 {
		t.Errorf("the embedder received %d model loads from a frontend", n)
	}
	// The operator may, and the frontend still answers status.
	admin := connectAs(t, url, s, control.RoleAdmin, nil)
	if _, err := control.Call(ctx, admin, control.SubjectModelLoad, control.LoadRequest{Bundle: "v2"}); err != nil {
		t.Errorf("admin → model load: %v", err)
	}
	sts, err := control.Gather(ctx, admin, time.Second)
	if err != nil || len(sts) != 1 || sts[0].Service != control.ServiceFrontend {
		t.Errorf("status gathered %+v, %v; want the frontend's answer", sts, err)
	}
}
