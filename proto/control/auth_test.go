package control

import (
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
