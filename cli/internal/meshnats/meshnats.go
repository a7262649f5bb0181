// Package meshnats runs the NATS server `recmesh run` embeds for its
// control plane, closed by default: every role of the mesh gets its own
// generated nkey, written as a seed file only its owner can read, and the
// server grants each identity only its role's subjects
// (control.PermissionsFor). An unauthenticated client is refused, and a
// frontend's identity cannot roll out a model.
package meshnats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/recmesh/recmesh/proto/control"
)

// Server is a running embedded NATS server and its identities.
type Server struct {
	*server.Server
	dir   string
	seeds map[control.Role]string
}

// Start generates an identity per role into a new private directory under
// parent ("" for the system's temporary directory) and starts a server on
// a free loopback port that accepts only those identities.
func Start(parent string) (*Server, error) {
	dir, err := os.MkdirTemp(parent, "recmesh-nats-")
	if err != nil {
		return nil, fmt.Errorf("meshnats: identities: %w", err)
	}
	s := &Server{dir: dir, seeds: map[control.Role]string{}}
	users, err := s.identities()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true, Nkeys: users}
	ns, err := server.NewServer(opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("meshnats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		os.RemoveAll(dir)
		return nil, errors.New("meshnats: embedded NATS did not start")
	}
	s.Server = ns
	return s, nil
}

// Seed is the path of role's nkey seed file: what NATS_NKEY names for a
// process of that role.
func (s *Server) Seed(role control.Role) string { return s.seeds[role] }

// Env is the environment a process of role connects with.
func (s *Server) Env(role control.Role) []string {
	return []string{"NATS_URL=" + s.ClientURL(), control.EnvNkey + "=" + s.Seed(role)}
}

// Shutdown stops the server and deletes the identities.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	os.RemoveAll(s.dir)
}

func (s *Server) identities() ([]*server.NkeyUser, error) {
	var users []*server.NkeyUser
	for _, role := range control.Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("meshnats: nkey for %s: %w", role, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		path := filepath.Join(s.dir, string(role)+".nk")
		if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("meshnats: write %s: %w", path, err)
		}
		s.seeds[role] = path
		perms, err := control.PermissionsFor(role)
		if err != nil {
			return nil, err
		}
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: serverPermissions(perms)})
	}
	return users, nil
}

// serverPermissions maps a role's allow-lists onto the server's: an empty
// publish list denies every publish except replies to received requests.
func serverPermissions(p control.Permissions) *server.Permissions {
	pub := &server.SubjectPermission{Allow: p.Publish}
	if len(p.Publish) == 0 {
		pub = &server.SubjectPermission{Deny: []string{">"}}
	}
	return &server.Permissions{
		Publish:   pub,
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
		// Replies to requests the client received: status, micro's
		// discovery, load and prepare answers.
		Response: &server.ResponsePermission{MaxMsgs: 1, Expires: 10 * time.Minute},
	}
}
