// Package rowupdate is the embedder's consumer of the row-update stream
// (package updates): a durable JetStream pull consumer on the serving
// model's subject, which hands each message to the store, acknowledges it
// once applied, and keeps the position a restart replays from.
//
// The consumer starts after the sequence the serving bundle includes and
// is recreated from the last applied sequence whenever it breaks (NATS
// restarted, the consumer was deleted), so nothing is applied twice out of
// order or skipped. A bad message is refused whole (Terminated, so it is
// never redelivered), counted and logged once; the consumer goes on.
package rowupdate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

// Options configure a Consumer.
type Options struct {
	// JS is the JetStream context of the embedder's NATS connection.
	JS jetstream.JetStream
	// Apply writes a message's rows into the serving tables or refuses it
	// whole. It is called from one goroutine at a time.
	Apply func(updates.Message) error
	// Record persists the last applied sequence (the serving record);
	// nil records nothing. It is called at most every RecordEvery.
	Record func(applied uint64) error
	// StreamBytes bounds the stream when the consumer creates it (0:
	// unlimited).
	StreamBytes int64
	// Instance names this embedder among those that follow the stream on
	// one NATS server (the serving pods of a scaled-out mesh): its durable
	// is embedder-<model id>-<instance>. Embedders sharing a durable would
	// split the updates between them, each applying only some. It must be
	// a valid consumer name part (CheckInstance); empty leaves it out.
	Instance string
	Log      *slog.Logger
	Registry prometheus.Registerer
}

// RecordEvery is how often the applied sequence is persisted while it
// moves: a restart replays at least this much more than it needs, never
// less.
const RecordEvery = time.Second

// yieldAfter is how long the consumer applies a backlog before it lets
// the lookups run; waited is how long Next must take to count as the
// backlog having drained.
const (
	yieldAfter = 2 * time.Millisecond
	waited     = 50 * time.Microsecond
)

// retryMax bounds the wait between attempts to reach the stream.
const retryMax = 5 * time.Second

// target is the model whose updates are applied.
type target struct {
	modelID string
	subject string
	base    uint64 // the bundle holds every update up to base
	until   uint64 // caught up once applied ≥ until and nothing is pending
	// follow numbers the targets set, so that a new one differs from the
	// last even when it names the same model and sequences: a message
	// fetched before must not pass for one fetched after.
	follow uint64
}

// Consumer applies one model's row updates as they come.
type Consumer struct {
	opts Options
	m    *metrics

	next chan target // the new target Follow or Handoff set, for Run

	// applying is held while a message is applied and its sequence
	// recorded, so that Hold sees tables and Applied agree.
	applying sync.Mutex

	mu       sync.Mutex
	follows  uint64 // targets set so far
	cur      target
	applied  uint64
	pending  uint64
	lag      time.Duration
	rows     uint64
	refused  uint64
	lastErr  string
	caughtUp chan struct{} // closed when cur is caught up
	caught   bool

	// reached is closed after the first attempt to reach the stream,
	// with reachErr its failure (nil: a consumer was created).
	reached  chan struct{}
	reachErr error
}

// New returns a consumer that follows nothing until Follow.
func New(opts Options) *Consumer {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Consumer{opts: opts, m: newMetrics(opts.Registry), next: make(chan target, 1), caughtUp: make(chan struct{}), reached: make(chan struct{})}
}

// Reached is closed once the consumer first tried to reach the stream;
// ReachErr then says whether it failed (JetStream off or unreachable).
func (c *Consumer) Reached() <-chan struct{} { return c.reached }

// ReachErr is the first attempt's failure, nil when it created its
// consumer; valid once Reached is closed.
func (c *Consumer) ReachErr() error {
	<-c.reached
	return c.reachErr
}

func (c *Consumer) markReached(err error) {
	select {
	case <-c.reached:
	default:
		c.reachErr = err
		close(c.reached)
	}
}

// Follow makes the consumer apply modelID's updates after sequence base
// (what its bundle includes). It reports caught up once it has applied
// up to until (the sequence the serving record says the tables reached
// before a restart; base when there is none) and the stream holds nothing
// newer. Follow replaces any earlier model.
func (c *Consumer) Follow(modelID string, base, until uint64) (<-chan struct{}, error) {
	subject, err := updates.RowsSubject(modelID)
	if err != nil {
		return nil, err
	}
	t := target{modelID: modelID, subject: subject, base: base, until: max(until, base)}
	return c.follow(t, base), nil
}

// follow makes t the target, its tables holding the updates up to
// applied, and hands it to Run.
func (c *Consumer) follow(t target, applied uint64) <-chan struct{} {
	c.mu.Lock()
	c.follows++
	t.follow = c.follows
	c.cur, c.applied, c.pending, c.caught = t, applied, 0, false
	c.caughtUp = make(chan struct{})
	ch := c.caughtUp
	c.mu.Unlock()
	c.m.applied.Set(float64(applied))
	select { // the newest target wins
	case <-c.next:
	default:
	}
	c.next <- t
	return ch
}

// following reports whether t is still the target.
func (c *Consumer) following(t target) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur == t
}

// Handoff moves the consumer to modelID for a rollout: its new tables,
// loaded but not serving yet, hold the updates up to base. It applies
// to them, with apply, every update of modelID the stream holds after
// base, while the serving tables go on taking theirs; then, with no
// update being applied anywhere, the few that came meanwhile; then it
// calls switchTo, which makes the new tables serve, and follows modelID
// from there. So the new tables never serve without an update the
// stream had when they started serving, and, for a rollout of the same
// model, without one the old tables had acknowledged. It returns the
// last sequence the new tables hold, which switchTo is also given. When
// the stream cannot be read, or switchTo fails, the consumer goes on with
// the serving model.
func (c *Consumer) Handoff(ctx context.Context, modelID string, base uint64, apply func(updates.Message) error, switchTo func(applied uint64) error) (uint64, error) {
	subject, err := updates.RowsSubject(modelID)
	if err != nil {
		return base, err
	}
	seq, err := c.catchUp(ctx, subject, base, apply)
	if err != nil {
		return seq, fmt.Errorf("rowupdate: replay %s after sequence %d: %w", subject, base, err)
	}
	c.applying.Lock()
	defer c.applying.Unlock()
	if seq, err = c.catchUp(ctx, subject, seq, apply); err != nil {
		return seq, fmt.Errorf("rowupdate: replay %s after sequence %d: %w", subject, base, err)
	}
	if err := switchTo(seq); err != nil {
		return seq, err
	}
	c.follow(target{modelID: modelID, subject: subject, base: base, until: seq}, seq)
	return seq, nil
}

// catchUpWait bounds the wait for a message the stream said it holds.
const catchUpWait = 5 * time.Second

// catchUp applies, with apply, the messages on subject after sequence
// after, up to the last one the stream holds now, and returns the last
// sequence it applied or refused. It reads with an ordered consumer of
// its own, which acknowledges nothing and leaves the durable alone.
func (c *Consumer) catchUp(ctx context.Context, subject string, after uint64, apply func(updates.Message) error) (uint64, error) {
	stream, err := c.opts.JS.Stream(ctx, updates.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) || noJetStream(err) {
		return after, nil // no stream, no updates
	}
	if err != nil {
		return after, fmt.Errorf("stream %s: %w", updates.Stream, err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return after, nil
	}
	if err != nil {
		return after, fmt.Errorf("last message on %s: %w", subject, err)
	}
	if last.Sequence <= after {
		return after, nil
	}
	oc, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    after + 1,
	})
	if err != nil {
		return after, fmt.Errorf("ordered consumer on %s: %w", subject, err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return after, fmt.Errorf("ordered consumer on %s: %w", subject, err)
	}
	defer it.Stop()
	seq := after
	for seq < last.Sequence {
		if err := ctx.Err(); err != nil {
			return seq, err
		}
		msg, err := it.Next(jetstream.NextMaxWait(catchUpWait))
		if err != nil {
			return seq, fmt.Errorf("after sequence %d of %d: %w", seq, last.Sequence, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return seq, fmt.Errorf("after sequence %d: message without metadata: %w", seq, err)
		}
		seq = meta.Sequence.Stream
		_ = c.apply(msg.Data(), seq, apply) // a refusal is counted and logged; the replay goes on
	}
	return seq, nil
}

// noJetStream reports an error that says the server runs no JetStream
// (for this account): NATS answers, but nothing holds updates.
func noJetStream(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// apply decodes and applies one message with f, or refuses it: counted,
// logged, the tables unchanged.
func (c *Consumer) apply(data []byte, seq uint64, f func(updates.Message) error) error {
	start := time.Now()
	m, err := updates.Decode(data)
	if err == nil {
		err = f(m)
	}
	if err != nil {
		reason := refusalReason(err)
		c.m.refused.WithLabelValues(reason).Inc()
		c.opts.Log.Warn("row update refused; the tables are unchanged", "sequence", seq, "reason", reason, "err", err)
		c.mu.Lock()
		c.refused++
		c.mu.Unlock()
		return err
	}
	c.m.apply.Observe(time.Since(start).Seconds())
	c.m.rows.Add(float64(m.Len()))
	c.m.messages.Inc()
	c.mu.Lock()
	c.rows += uint64(m.Len())
	c.mu.Unlock()
	return nil
}

// Status is the consumer's position, for the control plane.
func (c *Consumer) Status() control.UpdatesStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var consumer string
	if c.cur.modelID != "" {
		consumer = c.durable(c.cur)
	}
	return control.UpdatesStatus{
		Subject: c.cur.subject, Consumer: consumer, Base: c.cur.base, Applied: c.applied, Pending: c.pending,
		LagSeconds: c.lag.Seconds(), Rows: c.rows, Refused: c.refused, CaughtUp: c.caught, Error: c.lastErr,
	}
}

// Applied is the last sequence applied to the serving tables.
func (c *Consumer) Applied() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied
}

// Hold runs f while no message is being applied, with the last sequence
// applied: what f reads of the tables is exactly their state after that
// sequence (a hash an operator compares across a replay). Messages wait
// while f runs, so f must be short and must not wait for the consumer.
func (c *Consumer) Hold(f func(applied uint64)) {
	c.applying.Lock()
	defer c.applying.Unlock()
	f(c.Applied())
}

// Run consumes until ctx ends, following the target Follow last set.
func (c *Consumer) Run(ctx context.Context) error {
	var t target
	select {
	case t = <-c.next:
	case <-ctx.Done():
		return nil
	}
	wait := 100 * time.Millisecond
	for {
		err := c.consume(ctx, t)
		c.markReached(err)
		if ctx.Err() != nil {
			c.record()
			return nil
		}
		var next target
		var ok bool
		if errors.Is(err, errFollow) {
			next, ok = <-c.next, true
		}
		if ok {
			c.record()
			t, wait = next, 100*time.Millisecond
			continue
		}
		c.setError(err)
		c.opts.Log.Warn("row updates: consumer stopped; recreating it from the last applied sequence", "subject", t.subject, "applied", c.Applied(), "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			c.record()
			return nil
		case next = <-c.next:
			c.record()
			t, wait = next, 100*time.Millisecond
		case <-time.After(wait):
			wait = min(2*wait, retryMax)
		}
	}
}

// errFollow ends consume when Follow set a new target.
var errFollow = errors.New("rowupdate: following another model")

// durable is the consumer's name for t: one per model and embedder.
func (c *Consumer) durable(t target) string {
	if c.opts.Instance == "" {
		return "embedder-" + t.modelID
	}
	return "embedder-" + t.modelID + "-" + c.opts.Instance
}

// inactiveThreshold is how long the server keeps a durable nobody pulls
// from: an embedder that is gone (a replaced pod has a new instance name)
// leaves none behind. Its replacement starts from the serving record, not
// from a durable's position, so nothing depends on the durable outliving
// it.
const inactiveThreshold = time.Hour

// notInName are the characters a NATS consumer name cannot hold.
const notInName = ".*> \t\r\n/\\"

// CheckInstance refuses an instance name a consumer name cannot hold.
func CheckInstance(name string) error {
	if i := strings.IndexAny(name, notInName); i >= 0 {
		return fmt.Errorf("instance name %q: %q cannot be part of a NATS consumer name", name, name[i])
	}
	return nil
}

// DefaultInstance names an embedder by its host and segment: distinct for
// the serving pods of a mesh (each its own host name) and for meshes on
// one host (each its own segment), the same across restarts of one. The
// characters a consumer name cannot hold become '_'.
func DefaultInstance(segment string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune(notInName, r) {
			return '_'
		}
		return r
	}, host+"-"+segment)
}

// consume creates the durable consumer after the last applied sequence and
// applies messages until it breaks, ctx ends or Follow changes the model.
func (c *Consumer) consume(ctx context.Context, t target) error {
	js := c.opts.JS
	if _, err := js.Stream(ctx, updates.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateStream(ctx, updates.StreamConfig(c.opts.StreamBytes)); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", updates.Stream, err)
		}
	} else if err != nil {
		return fmt.Errorf("stream %s: %w", updates.Stream, err)
	}
	from := c.Applied() + 1
	name := c.durable(t)
	// A durable left by an earlier run remembers its own position, not
	// the tables': start it afresh where the tables are.
	if err := js.DeleteConsumer(ctx, updates.Stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s: %w", name, err)
	}
	cons, err := js.CreateConsumer(ctx, updates.Stream, jetstream.ConsumerConfig{
		Durable:           name,
		Description:       "recmesh embedder row updates for " + t.modelID,
		FilterSubject:     t.subject,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           30 * time.Second,
		MaxAckPending:     256,
		InactiveThreshold: inactiveThreshold,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", name, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	c.setError(nil)
	c.markReached(nil)
	c.opts.Log.Info("row updates: consuming", "subject", t.subject, "from_sequence", from, "pending", info.NumPending)
	c.setPending(info.NumPending)
	it, err := cons.Messages(jetstream.PullMaxMessages(64), jetstream.PullHeartbeat(2*time.Second))
	if err != nil {
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	stop := make(chan struct{})
	defer close(stop)
	stopped := make(chan error, 1)
	go func() {
		// Next blocks: the iterator is stopped when ctx ends or Follow
		// changes the model.
		select {
		case <-ctx.Done():
			stopped <- ctx.Err()
		case t := <-c.next:
			c.next <- t // Run reads it
			stopped <- errFollow
		case <-stop:
			stopped <- nil
		}
		it.Stop()
	}()
	last := time.Now()
	busy := last // since when messages came without waiting
	for {
		asked := time.Now()
		msg, err := it.Next()
		if got := time.Now(); got.Sub(asked) > waited {
			busy = got
		}
		if err != nil {
			select {
			case why := <-stopped:
				if why != nil {
					return why
				}
			default:
			}
			return fmt.Errorf("consumer %s: %w", name, err)
		}
		c.handle(msg, t)
		// On a core shared with lookups, a backlog is applied in slices
		// of at most yieldAfter, so lookups that became runnable meanwhile
		// wait no longer than that. Yielding after every message instead
		// let the consumer fall behind for good once the core was busy:
		// each yield queued it behind every runnable lookup, and the
		// updates' visibility grew with the backlog.
		if time.Since(busy) >= yieldAfter {
			runtime.Gosched()
			busy = time.Now()
		}
		if time.Since(last) >= RecordEvery {
			c.record()
			last = time.Now()
		}
	}
}

// handle applies or refuses one message of target t and acknowledges
// it.
func (c *Consumer) handle(msg jetstream.Msg, t target) {
	meta, err := msg.Metadata()
	if err != nil {
		c.opts.Log.Warn("row updates: message without metadata; skipped", "err", err)
		_ = msg.Term()
		return
	}
	c.applying.Lock()
	defer c.applying.Unlock()
	if !c.following(t) {
		// Fetched before a rollout moved the consumer on: the new
		// model's tables must not take it, nor its sequence count as
		// theirs.
		return
	}
	seq := meta.Sequence.Stream
	if err := c.apply(msg.Data(), seq, c.opts.Apply); err != nil {
		_ = msg.Term()
	} else {
		_ = msg.Ack()
	}
	lag := time.Since(meta.Timestamp)
	c.m.applied.Set(float64(seq))
	c.m.lagMessages.Set(float64(meta.NumPending))
	c.m.lagSeconds.Set(lag.Seconds())
	c.m.visible.Observe(lag.Seconds())
	c.mu.Lock()
	c.applied, c.pending, c.lag = seq, meta.NumPending, lag
	c.checkCaughtUpLocked()
	c.mu.Unlock()
}

func (c *Consumer) setPending(n uint64) {
	c.m.lagMessages.Set(float64(n))
	c.mu.Lock()
	c.pending = n
	c.checkCaughtUpLocked()
	c.mu.Unlock()
}

// checkCaughtUpLocked closes caughtUp once nothing is pending: the tables
// hold everything the stream has. That is normally at least until (what
// they held before a restart); when it is less, the stream lost updates
// (its limits dropped them, or it was deleted), and serving what it still
// has beats waiting forever.
func (c *Consumer) checkCaughtUpLocked() {
	if c.caught || c.pending != 0 {
		return
	}
	if c.applied < c.cur.until {
		c.opts.Log.Error("row updates: the stream no longer holds every update the tables had before the restart; serving without them",
			"subject", c.cur.subject, "applied", c.applied, "recorded", c.cur.until)
	}
	c.caught = true
	close(c.caughtUp)
}

func (c *Consumer) setError(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = ""
	if err != nil {
		c.lastErr = err.Error()
	}
}

// record persists the applied sequence.
func (c *Consumer) record() {
	if c.opts.Record == nil {
		return
	}
	if err := c.opts.Record(c.Applied()); err != nil {
		c.opts.Log.Error("row updates: cannot record the applied sequence; a restart would replay less", "err", err)
	}
}

func refusalReason(err error) string {
	switch {
	case errors.Is(err, updates.ErrEncoding):
		return "encoding"
	case errors.Is(err, updates.ErrValue):
		return "value"
	default:
		return "model"
	}
}
