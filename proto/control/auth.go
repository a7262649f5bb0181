package control

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/proto/updates"
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
	// RoleTrainer is whatever produces fresh weights (a training job,
	// recmesh update push): it may publish row updates and put dense
	// weights, and nothing that changes what the mesh serves otherwise.
	RoleTrainer Role = "trainer"
	// RoleAdmin is the operator's identity: recmesh status, model load.
	RoleAdmin Role = "admin"
)

// Roles lists every role.
var Roles = []Role{RoleEmbedder, RoleAccelerator, RoleFrontend, RoleTrainer, RoleAdmin}

// SubjectTablesHash asks the embedder for a hash over its serving tables'
// bytes (recmesh update status --hash), answered with TablesHashReply. It
// reads every byte of the tables, so only the embedder subscribes and only
// the operator may ask.
const SubjectTablesHash = "recmesh.embedder.tables-hash"

// TablesHashReply answers a request on SubjectTablesHash: the hash of the
// serving tables (hex) after the row updates up to stream sequence
// Applied; Error is set instead when the embedder cannot tell.
type TablesHashReply struct {
	Applied uint64 `json:"applied"`
	Hash    string `json:"hash"`
	Error   string `json:"error,omitempty"`
}

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

// JetStream's API subjects that the fresh-embedding roles need, each named
// for one stream so that no role can touch another stream, list streams,
// or delete one. The JetStream client sends its API requests with an
// inbox reply, which every role already subscribes to.
const (
	jsAPI = "$JS.API."
	// denseStream is the stream that backs the dense object store bucket,
	// denseSubjects its chunk ($O.<bucket>.C.<nuid>) and meta
	// ($O.<bucket>.M.<name>) subjects (nats.go jetstream's object store).
	denseStream   = "OBJ_" + updates.DenseBucket
	denseSubjects = "$O." + updates.DenseBucket + ".>"
)

var (
	// trainerPublish: the row updates and the stream they go to (a trainer
	// creates it when it is first to come), and the dense bucket:
	// ObjectStore and CreateObjectStore (stream info, create), Put (its
	// GetInfo of the object it replaces is a direct get of the last meta
	// message, a message get where direct gets are off; the chunks and the
	// meta message, acknowledged; a purge of the replaced object's chunks).
	// No STREAM.UPDATE or DELETE of either stream, no consumer: a trainer
	// cannot change the stream's limits, drop updates, or read them back.
	trainerPublish = []string{
		updates.SubjectPrefix + ">",
		jsAPI + "STREAM.INFO." + updates.Stream,
		jsAPI + "STREAM.CREATE." + updates.Stream,
		denseSubjects,
		jsAPI + "STREAM.INFO." + denseStream,
		jsAPI + "STREAM.CREATE." + denseStream,
		jsAPI + "STREAM.PURGE." + denseStream,
		jsAPI + "DIRECT.GET." + denseStream + ".>",
		jsAPI + "STREAM.MSG.GET." + denseStream,
		// recmesh update push --wait follows the embedder's progress in
		// its status, which every process answers.
		SubjectStatus,
	}

	// embedderUpdatesPublish: a durable pull consumer on the row updates,
	// filtered on its model's subject: the stream's info (and its creation,
	// so an embedder that starts before any trainer can wait on it), the
	// consumer's creation (nats.go's jetstream names the consumer and the
	// filter in the subject; DURABLE.CREATE is the older form), info and
	// deletion, pulls, acks, and a message get by sequence.
	embedderUpdatesPublish = []string{
		jsAPI + "STREAM.INFO." + updates.Stream,
		jsAPI + "STREAM.CREATE." + updates.Stream,
		jsAPI + "STREAM.MSG.GET." + updates.Stream,
		jsAPI + "CONSUMER.CREATE." + updates.Stream + ".>",
		jsAPI + "CONSUMER.DURABLE.CREATE." + updates.Stream + ".>",
		jsAPI + "CONSUMER.INFO." + updates.Stream + ".>",
		jsAPI + "CONSUMER.DELETE." + updates.Stream + ".>",
		jsAPI + "CONSUMER.MSG.NEXT." + updates.Stream + ".>",
		"$JS.ACK." + updates.Stream + ".>",
	}

	// acceleratorDensePublish: reading and watching the dense bucket.
	// ObjectStore is a stream info; GetInfo a direct get of the object's
	// last meta message (a message get where direct gets are off); Get and
	// Watch subscribe through ordered push consumers, which the legacy
	// JetStream API behind them creates named, with the filter in the
	// subject (CONSUMER.CREATE.<stream>.<name>.<filter>), deletes and
	// recreates after a gap, and flow-controls ($JS.FC replies, which
	// allow_responses also covers). Chunks and meta messages arrive on the
	// consumers' inboxes, so no $O subscription is needed.
	acceleratorDensePublish = []string{
		jsAPI + "STREAM.INFO." + denseStream,
		jsAPI + "DIRECT.GET." + denseStream + ".>",
		jsAPI + "STREAM.MSG.GET." + denseStream,
		jsAPI + "CONSUMER.CREATE." + denseStream + ".>",
		jsAPI + "CONSUMER.DELETE." + denseStream + ".>",
		"$JS.FC." + denseStream + ".>",
	}
)

// PermissionsFor returns role's permissions.
func PermissionsFor(role Role) (Permissions, error) {
	switch role {
	case RoleEmbedder:
		return Permissions{
			Publish:   append([]string{SubjectSegment, SubjectPrepare}, embedderUpdatesPublish...),
			Subscribe: append([]string{SubjectModelLoad, SubjectSnapshot, SubjectTablesHash}, serviceSubscribe...),
		}, nil
	case RoleAccelerator:
		return Permissions{
			Publish:   slices.Clone(acceleratorDensePublish),
			Subscribe: append([]string{SubjectPrepare, SubjectSegment}, serviceSubscribe...),
		}, nil
	case RoleFrontend:
		return Permissions{
			Subscribe: append([]string{SubjectSegment}, serviceSubscribe...),
		}, nil
	case RoleTrainer:
		// Not a service: it answers nothing, it only hears the replies
		// to its own requests (API calls, publish acknowledgements).
		return Permissions{
			Publish:   slices.Clone(trainerPublish),
			Subscribe: []string{"_INBOX.>"},
		}, nil
	case RoleAdmin:
		return Permissions{Publish: []string{">"}, Subscribe: []string{">"}}, nil
	}
	return Permissions{}, errors.New("control: unknown role " + string(role))
}
