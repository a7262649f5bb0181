package control

import (
	"slices"
	"strings"
	"testing"
)

func TestAuthOptions(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name   string
		env    func(string) string
		opts   int
		errHas string
	}{
		{name: "none", env: env(), opts: 0},
		{name: "user and password", env: env(EnvUser, "u", EnvPassword, "p"), opts: 1},
		{name: "user alone", env: env(EnvUser, "u"), errHas: EnvPassword},
		{name: "missing nkey file", env: env(EnvNkey, "/nonexistent/seed.nk"), errHas: EnvNkey},
		{name: "missing creds file", env: env(EnvCreds, "/nonexistent/x.creds"), errHas: EnvCreds},
		{name: "two identities", env: env(EnvUser, "u", EnvPassword, "p", EnvCreds, "/"), errHas: "one NATS identity"},
		{name: "TLS", env: env(EnvCA, "/ca.pem", EnvCert, "/c.pem", EnvKey, "/k.pem"), opts: 2},
		{name: "cert without key", env: env(EnvCert, "/c.pem"), errHas: EnvKey},
	} {
		opts, err := AuthOptions(tc.env)
		switch {
		case tc.errHas != "":
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("%s: err %v; want one naming %s", tc.name, err, tc.errHas)
			}
		case err != nil || len(opts) != tc.opts:
			t.Errorf("%s: %d options, %v; want %d", tc.name, len(opts), err, tc.opts)
		}
	}
}

func TestPermissionsForEveryRole(t *testing.T) {
	for _, r := range Roles {
		p, err := PermissionsFor(r)
		if err != nil {
			t.Fatal(err)
		}
		if r != RoleAdmin {
			for _, s := range p.Publish {
				if s == SubjectModelLoad || s == ">" {
					t.Errorf("role %s may publish %s", r, s)
				}
			}
		}
	}
	if _, err := PermissionsFor("nobody"); err == nil {
		t.Error("an unknown role has permissions")
	}
}

// TestFreshEmbeddingPermissions pins what the roles of fresh embeddings
// may do: the trainer publishes updates and dense weights and nothing of
// the rollout; no role but the operator's may delete or reconfigure a
// stream or use JetStream's API at large; a frontend publishes nothing.
func TestFreshEmbeddingPermissions(t *testing.T) {
	perms := map[Role]Permissions{}
	for _, r := range Roles {
		p, err := PermissionsFor(r)
		if err != nil {
			t.Fatal(err)
		}
		perms[r] = p
	}
	if !slices.Contains(Roles, RoleTrainer) {
		t.Fatal("Roles lacks the trainer")
	}
	tr := perms[RoleTrainer]
	for _, want := range []string{"recmesh.updates.rows.>", "$JS.API.STREAM.CREATE.RECMESH_UPDATES", "$O.recmesh-dense.>", "$JS.API.STREAM.PURGE.OBJ_recmesh-dense"} {
		if !slices.Contains(tr.Publish, want) {
			t.Errorf("trainer may not publish %s", want)
		}
	}
	for _, s := range []string{SubjectModelLoad, SubjectPrepare, SubjectSegment, SubjectTablesHash, SubjectSnapshot} {
		if slices.Contains(tr.Publish, s) || slices.Contains(tr.Subscribe, s) {
			t.Errorf("trainer may use %s", s)
		}
	}
	if !slices.Equal(tr.Subscribe, []string{"_INBOX.>"}) {
		t.Errorf("trainer subscribes %v; want its inbox only", tr.Subscribe)
	}
	for _, s := range []string{SubjectTablesHash, SubjectSnapshot} {
		if !slices.Contains(perms[RoleEmbedder].Subscribe, s) {
			t.Errorf("the embedder does not answer %s", s)
		}
	}
	if len(perms[RoleFrontend].Publish) != 0 {
		t.Errorf("a frontend may publish %v", perms[RoleFrontend].Publish)
	}
	for r, p := range perms {
		if r == RoleAdmin {
			continue
		}
		for _, s := range p.Publish {
			if strings.Contains(s, ".DELETE.") && !strings.HasPrefix(s, "$JS.API.CONSUMER.DELETE.") ||
				strings.Contains(s, "STREAM.UPDATE") || strings.HasPrefix(s, "$JS.API.>") || s == "$JS.>" ||
				strings.Contains(s, "*") {
				t.Errorf("role %s may publish %s", r, s)
			}
			if strings.HasPrefix(s, "$JS.API.") && !strings.Contains(s, "RECMESH_UPDATES") && !strings.Contains(s, "OBJ_recmesh-dense") {
				t.Errorf("role %s may use %s, beyond the two streams of fresh embeddings", r, s)
			}
		}
		if (r == RoleEmbedder || r == RoleAccelerator || r == RoleFrontend) && slices.Contains(p.Publish, "recmesh.updates.rows.>") {
			t.Errorf("role %s may publish row updates", r)
		}
	}
}
