// Package control is recmesh's control plane over NATS: the subjects, the
// messages every process exchanges on them, and the small helpers that
// register a process as a NATS micro service (name, version, ping, info,
// stats — visible to `nats micro ls`) with a status endpoint.
//
// The data plane never waits on NATS: a process without a NATS URL serves
// normally and only loses announcements (frontends then find new
// generations by watching the segment file).
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Subjects.
const (
	// SubjectSegment carries Announce: the embedder publishes one whenever a
	// segment generation becomes ready, and again periodically so late
	// joiners learn it.
	SubjectSegment = "recmesh.segment"
	// SubjectStatus is answered by every process (no queue group), so one
	// request gathers the status of the whole mesh.
	SubjectStatus = "recmesh.status"
)

// Service names, as `nats micro ls` shows them.
const (
	ServiceEmbedder    = "recmesh-embedder"
	ServiceAccelerator = "recmesh-accelerator"
	ServiceFrontend    = "recmesh-frontend"
)

// Announce tells frontends and the accelerator where the current segment
// generation lives.
type Announce struct {
	Path       string `json:"path"`
	Generation uint64 `json:"generation"`
	ModelID    string `json:"model_id"`
}

// Status is one process's answer on SubjectStatus.
type Status struct {
	Service    string       `json:"service"`
	ID         string       `json:"id"`
	Host       string       `json:"host"`
	PID        int          `json:"pid"`
	Version    string       `json:"version"`
	State      string       `json:"state"` // e.g. ready, waiting, draining
	Ready      bool         `json:"ready"`
	Generation uint64       `json:"generation"`
	ModelID    string       `json:"model_id,omitempty"`
	Lanes      []LaneStatus `json:"lanes,omitempty"`
	QueueDepth int          `json:"queue_depth"`
	Detail     string       `json:"detail,omitempty"`
	// Updates is the embedder's row-update consumer (nil elsewhere, or
	// with updates off); Dense the accelerator's dense-weight swaps.
	Updates *UpdatesStatus `json:"updates,omitempty"`
	Dense   *DenseStatus   `json:"dense,omitempty"`
}

// LanesInUse is how many of the embedder's lanes a frontend owns.
func (s Status) LanesInUse() int {
	n := 0
	for _, l := range s.Lanes {
		if l.Owner != 0 {
			n++
		}
	}
	return n
}

// UpdatesStatus is where the embedder stands in its model's row-update
// stream (package updates): a trainer waits for Applied to reach the
// sequence its publish was acknowledged with.
type UpdatesStatus struct {
	Subject string `json:"subject"`
	// Consumer is the embedder's durable consumer on the stream: one per
	// embedder, so that each applies every update.
	Consumer string `json:"consumer,omitempty"`
	// Base is the stream sequence the serving bundle already includes;
	// Applied the last sequence applied to the serving tables (≥ Base).
	Base    uint64 `json:"base"`
	Applied uint64 `json:"applied"`
	// Pending is how many messages the stream holds beyond Applied, as the
	// consumer last saw it; LagSeconds the age of the last applied
	// message when it was applied.
	Pending    uint64  `json:"pending"`
	LagSeconds float64 `json:"lag_seconds"`
	Rows       uint64  `json:"rows_applied"`
	Refused    uint64  `json:"refused"`
	// CaughtUp is false while a restarted embedder replays the stream
	// before it serves.
	CaughtUp bool   `json:"caught_up"`
	Error    string `json:"error,omitempty"`
	// TablesHash is a hash over the serving tables' bytes, given only when
	// asked for (it reads every byte).
	TablesHash string `json:"tables_hash,omitempty"`
}

// SubjectSnapshot asks the embedder to write its serving tables, row
// updates included, as a new bundle inside its model root (recmesh model
// snapshot); only the operator may ask.
const SubjectSnapshot = "recmesh.embedder.snapshot"

// SnapshotRequest names the new bundle's directory, relative to the
// model root or absolute inside it; it must not exist.
type SnapshotRequest struct {
	Out string `json:"out"`
}

// SnapshotReply is the written bundle and the last row-update sequence it
// includes (its config.json's updates_seq).
type SnapshotReply struct {
	Bundle     string `json:"bundle,omitempty"`
	ModelID    string `json:"model_id,omitempty"`
	UpdatesSeq uint64 `json:"updates_seq"`
	Error      string `json:"error,omitempty"`
}

// DenseStatus is the accelerator's dense weights: which object revision it
// serves and how many swaps it made.
type DenseStatus struct {
	Source  string `json:"source"` // "bundle" or the object store's name@revision
	Swaps   uint64 `json:"swaps"`
	Refused uint64 `json:"refused"`
	Error   string `json:"error,omitempty"`
}

// LaneStatus is one lane of the embedder's segment.
type LaneStatus struct {
	Index  int    `json:"index"`
	Owner  int    `json:"owner"`
	State  string `json:"state"`
	Queued int    `json:"queued"`
}

// Connect dials url with reconnects that never give up: a NATS restart
// must not take a serving process down. The identity and TLS come from the
// NATS_* environment (AuthOptions).
func Connect(url, name string, log *slog.Logger) (*nats.Conn, error) {
	auth, err := AuthOptions(os.Getenv)
	if err != nil {
		return nil, err
	}
	opts := append(auth,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && log != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// Permission violations arrive here: a misconfigured role
			// must be visible, not silent.
			if log != nil {
				log.Error("nats", "err", err)
			}
		}),
	)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("control: connect %s (check NATS_URL): %w", url, err)
	}
	return nc, nil
}

// Dial connects a short-lived client (recmesh status, model load) once,
// without Connect's endless retries, so a refused identity is an error
// that says what to set rather than a wait that times out.
func Dial(url, name string) (*nats.Conn, error) {
	auth, err := AuthOptions(os.Getenv)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(auth, nats.Name(name), nats.MaxReconnects(0), nats.Timeout(5*time.Second))...)
	if errors.Is(err, nats.ErrAuthorization) || err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization") {
		return nil, fmt.Errorf("control: %s refused this client's identity: %w (set %s to the operator's seed file, which recmesh run prints, or %s/%s/%s)",
			url, err, EnvNkey, EnvCreds, EnvUser, EnvPassword)
	}
	if err != nil {
		return nil, fmt.Errorf("control: connect %s (check NATS_URL): %w", url, err)
	}
	return nc, nil
}

// Register adds the process as a micro service with a status endpoint that
// answers with status().
func Register(nc *nats.Conn, service, version string, status func() Status) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        service,
		Version:     semver(version),
		Description: "recmesh " + service,
	})
	if err != nil {
		return nil, fmt.Errorf("control: register %s: %w", service, err)
	}
	host, _ := os.Hostname()
	id := svc.Info().ID
	handler := micro.HandlerFunc(func(r micro.Request) {
		st := status()
		st.Service, st.ID, st.Host, st.PID, st.Version = service, id, host, os.Getpid(), version
		_ = r.RespondJSON(st)
	})
	if err := svc.AddEndpoint("status", handler,
		micro.WithEndpointSubject(SubjectStatus), micro.WithEndpointQueueGroupDisabled()); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("control: status endpoint: %w", err)
	}
	return svc, nil
}

// semverRE is SemVer 2.0's grammar, which micro validates versions with.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// semver makes a version micro accepts: a tagged build's v1.2.3 becomes
// 1.2.3, anything else (telemetry.Version's devel+<revision>-dirty, "")
// becomes a 0.0.0 pre-release carrying it.
func semver(v string) string {
	if t := strings.TrimPrefix(v, "v"); semverRE.MatchString(t) {
		return t
	}
	pre, build, _ := strings.Cut(v, "+")
	clean := func(s string) string {
		return strings.Trim(strings.Map(func(r rune) rune {
			if r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
				return r
			}
			return '-'
		}, s), ".")
	}
	out := "0.0.0-dev"
	if p := clean(pre); p != "" && semverRE.MatchString("0.0.0-"+p) {
		out = "0.0.0-" + p
	}
	if b := clean(build); b != "" && semverRE.MatchString(out+"+"+b) {
		out += "+" + b
	}
	return out
}

// PublishAnnounce sends a on SubjectSegment.
func PublishAnnounce(nc *nats.Conn, a Announce) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return nc.Publish(SubjectSegment, b)
}

// Gather asks every process for its status and collects the answers that
// arrive within wait.
func Gather(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]Status, error) {
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(SubjectStatus, inbox, nil); err != nil {
		return nil, err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var out []Status
	for {
		select {
		case m := <-ch:
			var st Status
			if err := json.Unmarshal(m.Data, &st); err == nil {
				out = append(out, st)
			}
		case <-timer.C:
			return out, nil
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
}

// WatchAnnounce calls fn for every Announce until ctx is done.
func WatchAnnounce(ctx context.Context, nc *nats.Conn, fn func(Announce)) error {
	sub, err := nc.Subscribe(SubjectSegment, func(m *nats.Msg) {
		var a Announce
		if json.Unmarshal(m.Data, &a) == nil {
			fn(a)
		}
	})
	if err != nil {
		return fmt.Errorf("control: subscribe %s: %w", SubjectSegment, err)
	}
	go func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
	}()
	return nil
}

// ErrNoURL is returned where a control-plane action needs NATS and none is
// configured.
var ErrNoURL = errors.New("control: no NATS URL (set NATS_URL or --nats-url)")

// Rollout subjects.
const (
	// SubjectModelLoad asks the embedder to roll out the bundle in
	// LoadRequest.Bundle (recmesh model load). It answers LoadReply once the
	// new generation serves, or with the reason the old one still does.
	SubjectModelLoad = "recmesh.model.load"
	// SubjectPrepare asks the accelerator to compile the program for a
	// bundle while it keeps serving; the embedder sends it during a rollout
	// before it switches generations.
	SubjectPrepare = "recmesh.accelerator.prepare"
)

// LoadRequest names a bundle directory, as the receiving process sees it.
type LoadRequest struct {
	Bundle string `json:"bundle"`
}

// LoadReply answers a LoadRequest; Error is empty on success.
type LoadReply struct {
	Generation uint64 `json:"generation,omitempty"`
	ModelID    string `json:"model_id,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Call sends req as JSON on subject and decodes the LoadReply, turning a
// reply's Error into an error.
func Call(ctx context.Context, nc *nats.Conn, subject string, req LoadRequest) (LoadReply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return LoadReply{}, err
	}
	msg, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return LoadReply{}, fmt.Errorf("control: %s: %w", subject, err)
	}
	var rep LoadReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return LoadReply{}, fmt.Errorf("control: %s: bad reply: %w", subject, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// Serve answers LoadRequests on subject with handle, each in its own
// goroutine (a rollout takes seconds), as an endpoint of svc.
func Serve(svc micro.Service, name, subject string, handle func(LoadRequest) LoadReply) error {
	return svc.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) {
		var req LoadRequest
		if err := json.Unmarshal(r.Data(), &req); err != nil || req.Bundle == "" {
			_ = r.RespondJSON(LoadReply{Error: "request needs {\"bundle\": \"<dir>\"}"})
			return
		}
		go func() { _ = r.RespondJSON(handle(req)) }()
	}), micro.WithEndpointSubject(subject))
}
