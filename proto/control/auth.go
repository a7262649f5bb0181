package control

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// Environment variables of the NATS connection, as the nats CLI and the
// NATS documentation name them; each is optional.
const (
	EnvCreds    = "NATS_CREDS"    // a .creds file (JWT and nkey seed)
	EnvNkey     = "NATS_NKEY"     // a file holding an nkey seed
	EnvUser     = "NATS_USER"     // user name, with NATS_PASSWORD
	EnvPassword = "NATS_PASSWORD" //
	EnvCA       = "NATS_CA"       // CA bundle to verify the server with
	EnvCert     = "NATS_CERT"     // client certificate, with NATS_KEY
	EnvKey      = "NATS_KEY"      //
)

// AuthOptions turns the NATS_* environment into connection options. At
// most one identity (creds, nkey, or user and password) may be set; TLS
// options combine with any of them. Credentials in the URL
// (nats://user:pass@host) also work, as nats.go reads them itself.
func AuthOptions(getenv func(string) string) ([]nats.Option, error) {
	var opts []nats.Option
	identities := 0
	if f := getenv(EnvCreds); f != "" {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("control: %s: %w", EnvCreds, err)
		}
		opts = append(opts, nats.UserCredentials(f))
		identities++
	}
	if f := getenv(EnvNkey); f != "" {
		o, err := nats.NkeyOptionFromSeed(f)
		if err != nil {
			return nil, fmt.Errorf("control: %s=%s: %w", EnvNkey, f, err)
		}
		opts = append(opts, o)
		identities++
	}
	user, pass := getenv(EnvUser), getenv(EnvPassword)
	if user != "" || pass != "" {
		if user == "" || pass == "" {
			return nil, fmt.Errorf("control: set both %s and %s, or neither", EnvUser, EnvPassword)
		}
		opts = append(opts, nats.UserInfo(user, pass))
		identities++
	}
	if identities > 1 {
		return nil, fmt.Errorf("control: set one NATS identity: %s, %s, or %s and %s", EnvCreds, EnvNkey, EnvUser, EnvPassword)
	}
	if ca := getenv(EnvCA); ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	cert, key := getenv(EnvCert), getenv(EnvKey)
	if cert != "" || key != "" {
		if cert == "" || key == "" {
			return nil, fmt.Errorf("control: set both %s and %s, or neither", EnvCert, EnvKey)
		}
		opts = append(opts, nats.ClientCert(cert, key))
	}
	return opts, nil
}

// Role is what a process may do on the control plane. A NATS server that
// authenticates recmesh processes grants each identity its role's
// subjects (Permissions), so a compromised frontend cannot roll out a
// model or pose as the embedder.
type Role string

// Roles.
const (
	RoleEmbedder    Role = "embedder"
	RoleAccelerator Role = "accelerator"
	RoleFrontend    Role = "frontend"
	// RoleAdmin is the operator's identity: recmesh status, model load.
	RoleAdmin Role = "admin"
)

// Roles lists every role.
var Roles = []Role{RoleEmbedder, RoleAccelerator, RoleFrontend, RoleAdmin}

// Permissions is a role's allow-list of subjects. Answering a request
// (status, micro's $SRV pings, a load or prepare) needs no publish
// permission: servers grant replies to the requests a client received.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// Every service answers status requests and micro's discovery, and
// receives replies to its own requests on an inbox.
var serviceSubscribe = []string{SubjectStatus, "$SRV.>", "_INBOX.>"}

// PermissionsFor returns role's permissions.
func PermissionsFor(role Role) (Permissions, error) {
	switch role {
	case RoleEmbedder:
		return Permissions{
			Publish:   []string{SubjectSegment, SubjectPrepare},
			Subscribe: append([]string{SubjectModelLoad}, serviceSubscribe...),
		}, nil
	case RoleAccelerator:
		return Permissions{
			Subscribe: append([]string{SubjectPrepare, SubjectSegment}, serviceSubscribe...),
		}, nil
	case RoleFrontend:
		return Permissions{
			Subscribe: append([]string{SubjectSegment}, serviceSubscribe...),
		}, nil
	case RoleAdmin:
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}, nil
	}
	return Permissions{}, errors.New("control: unknown role " + string(role))
}
