package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

func init() {
	registerUpdate(&updateCommand{
		name:    "push",
		summary: "publish embedding row updates (--rows FILE or --random N) to the model's subject of the " + updates.Stream + " stream",
		run:     runUpdatePush,
	})
}

// maxRandomRows bounds --random: the rows are generated one message at a
// time, but a mistyped count should not flood the stream.
const maxRandomRows = 100_000_000

// waitPoll is how often --wait asks for the embedders' status: visible_ms
// is at most this much late.
const waitPoll = 25 * time.Millisecond

// waitQuorum is how long --wait listens before it trusts that every
// embedder following the subject has answered at least once (one status
// round of `recmesh status`).
const waitQuorum = 500 * time.Millisecond

func runUpdatePush(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("update push", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL); the identity comes from NATS_NKEY, NATS_CREDS or NATS_USER/NATS_PASSWORD: the trainer's or the operator's")
	bundle := fs.String("bundle", model.DefaultDevBundle, "model bundle `dir` whose config.json gives the model id, the tables, their vocabulary sizes and the row width")
	modelID := fs.String("model", "", "model `id` whose subject the rows go to (default: the bundle's)")
	rowsFile := fs.String("rows", "", "`file` of rows to push, one JSON object a line: {\"table\":T,\"id\":I,\"values\":[… embedding_dim floats]}")
	random := fs.Int("random", 0, "push `N` random rows instead: tables and ids uniform, values uniform in [-0.05, 0.05) from --seed")
	seed := fs.Uint64("seed", 1, "seed of the --random rows (the same seed pushes the same rows)")
	table := fs.Int("table", -1, "with --random, only table `T` (0-based); default every table")
	perMessage := fs.Int("per-message", updates.MaxRows, "rows in one message, 1.."+fmt.Sprint(updates.MaxRows)+" (a message is applied whole)")
	wait := fs.Bool("wait", false, "after publishing, wait until every embedder following the subject has applied the last message, and report how long that took (visible_ms, from the last acknowledgement)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long, publishing and --wait together")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	if (*rowsFile == "") == (*random == 0) {
		return usagef("update push needs one of --rows FILE and --random N")
	}
	if *random < 0 || *random > maxRandomRows {
		return usagef("--random %d: want 1..%d", *random, maxRandomRows)
	}
	if *perMessage < 1 || *perMessage > updates.MaxRows {
		return usagef("--per-message %d: want 1..%d", *perMessage, updates.MaxRows)
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: want a positive duration", *timeout)
	}
	cfg, err := model.ReadConfig(*bundle)
	if err != nil {
		return usagef("--bundle: %v", err)
	}
	id := cfg.ID()
	if *modelID != "" {
		id = *modelID
	}
	subject, err := updates.RowsSubject(id)
	if err != nil {
		return usagef("--model: %v", err)
	}
	if *table != -1 && (*rowsFile != "" || *table < 0 || *table >= len(cfg.VocabSizes)) {
		if *rowsFile != "" {
			return usagef("--table selects the tables of --random rows; --rows names each row's table")
		}
		return usagef("--table %d: the model has tables 0..%d", *table, len(cfg.VocabSizes)-1)
	}

	// Every row is checked before anything is published: a push is
	// refused whole rather than half applied.
	var src rowSource
	if *rowsFile != "" {
		rows, err := readRowsFile(*rowsFile, cfg)
		if err != nil {
			return err
		}
		src = &sliceRows{rows: rows}
	} else {
		src = newRandomRows(cfg, *random, *table, *seed)
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	nc, err := control.Dial(*natsURL, "recmesh-update-push")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := failOnRefusal(ctx, nc)
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("update push: %w", err)
	}
	if err := ensureStream(ctx, js); err != nil {
		return err
	}
	res, err := publishRows(ctx, js, subject, cfg.EmbeddingDim, *perMessage, src)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("pushed rows=%d messages=%d first_seq=%d last_seq=%d subject=%s", res.rows, res.messages, res.firstSeq, res.lastSeq, subject)
	if *wait {
		applied, visible, err := waitApplied(ctx, nc, subject, res.lastSeq, res.lastAck)
		if err != nil {
			// The rows are in the stream: say so, then why the wait failed.
			fmt.Fprintln(e.stdout, line)
			return fmt.Errorf("update push --wait: %w", err)
		}
		line += fmt.Sprintf(" applied=%d visible_ms=%d", applied, visible.Milliseconds())
	}
	fmt.Fprintln(e.stdout, line)
	return nil
}

// ensureStream creates the updates stream when no one has yet (the
// embedder creates it too; whoever comes first).
func ensureStream(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.Stream(ctx, updates.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, updates.StreamConfig(0))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // created meanwhile, by an embedder or another push
		}
	}
	if err != nil {
		return fmt.Errorf("update push: stream %s: %w (is JetStream on, and may this identity use it? a trainer's or the operator's may)", updates.Stream, cause(ctx, err))
	}
	return nil
}

// failOnRefusal returns a context that ends as soon as the server reports
// a permissions violation on nc, with the violation as its cause: a
// refused publish or request is otherwise dropped, and its caller would
// wait for its timeout to learn nothing.
func failOnRefusal(ctx context.Context, nc *nats.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			cancel(fmt.Errorf("the NATS server refused this identity (%s): %w", control.EnvNkey, err))
		}
	})
	return ctx, func() { cancel(nil) }
}

// cause is err, or the reason ctx ended when it did (failOnRefusal's
// violation, the deadline).
func cause(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
			return c
		}
	}
	return err
}

// rowSource yields the rows of a push in order.
type rowSource interface {
	// next fills up to len(dst) rows into dst and returns how many; 0 at
	// the end. The rows' Values may be reused by the next call.
	next(dst []updates.Row) int
	len() int
}

type sliceRows struct {
	rows []updates.Row
	at   int
}

func (s *sliceRows) len() int { return len(s.rows) }

func (s *sliceRows) next(dst []updates.Row) int {
	n := copy(dst, s.rows[s.at:])
	s.at += n
	return n
}

// randomRows generates rows as it goes, so --random N needs memory for
// one message only.
type randomRows struct {
	cfg        model.Config
	rng        *mrand.Rand
	n, left    int
	table      int // -1: any
	valuesPool [][]float32
}

func newRandomRows(cfg model.Config, n, table int, seed uint64) *randomRows {
	return &randomRows{cfg: cfg, rng: mrand.New(mrand.NewPCG(seed, 0x7265636d657368)), n: n, left: n, table: table}
}

func (r *randomRows) len() int { return r.n }

func (r *randomRows) next(dst []updates.Row) int {
	k := min(len(dst), r.left)
	for len(r.valuesPool) < k {
		r.valuesPool = append(r.valuesPool, make([]float32, r.cfg.EmbeddingDim))
	}
	for i := range k {
		t := r.table
		if t < 0 {
			t = r.rng.IntN(len(r.cfg.VocabSizes))
		}
		v := r.valuesPool[i]
		for j := range v {
			// The export's scale: rows stay as small as the model's own.
			v[j] = (r.rng.Float32() - 0.5) * 0.1
		}
		dst[i] = updates.Row{Table: t, ID: r.rng.IntN(r.cfg.VocabSizes[t]), Values: v}
	}
	r.left -= k
	return k
}

// rowLine is one line of a --rows file. Pointers tell a missing field
// from a zero.
type rowLine struct {
	Table  *int      `json:"table"`
	ID     *int64    `json:"id"`
	Values []float64 `json:"values"`
}

// readRowsFile reads and checks every row of path against cfg; an error
// is a usage error naming the line.
func readRowsFile(path string, cfg model.Config) ([]updates.Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("--rows: %v", err)
	}
	defer f.Close()
	rows, err := parseRows(f, cfg)
	if err != nil {
		return nil, usagef("--rows %s: %v", path, err)
	}
	return rows, nil
}

// parseRows decodes JSON lines of rows, checking each against cfg: a
// known table, an id inside its vocabulary, embedding_dim finite values
// (as float32). Blank lines are skipped.
func parseRows(r io.Reader, cfg model.Config) ([]updates.Row, error) {
	sc := bufio.NewScanner(r)
	// A row of 128 floats printed in full is a few KiB; leave room for
	// wider models and generous formatting.
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var rows []updates.Row
	for n := 1; sc.Scan(); n++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		row, err := parseRow(b, cfg)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, errors.New("no rows")
	}
	return rows, nil
}

func parseRow(b []byte, cfg model.Config) (updates.Row, error) {
	var l rowLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return updates.Row{}, fmt.Errorf("not a row object: %v", err)
	}
	if dec.More() {
		return updates.Row{}, errors.New("more than one JSON value on the line")
	}
	switch {
	case l.Table == nil:
		return updates.Row{}, errors.New(`no "table"`)
	case l.ID == nil:
		return updates.Row{}, errors.New(`no "id"`)
	case *l.Table < 0 || *l.Table >= len(cfg.VocabSizes):
		return updates.Row{}, fmt.Errorf("table %d is not one of the model's tables 0..%d", *l.Table, len(cfg.VocabSizes)-1)
	case *l.ID < 0 || *l.ID >= int64(cfg.VocabSizes[*l.Table]):
		return updates.Row{}, fmt.Errorf("id %d is outside table %d's rows 0..%d", *l.ID, *l.Table, cfg.VocabSizes[*l.Table]-1)
	case len(l.Values) != cfg.EmbeddingDim:
		return updates.Row{}, fmt.Errorf("%d values, want the model's embedding_dim %d", len(l.Values), cfg.EmbeddingDim)
	}
	vals := make([]float32, len(l.Values))
	for i, v := range l.Values {
		f := float32(v)
		// JSON has no NaN or infinity; a value beyond float32's range
		// becomes one here.
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return updates.Row{}, fmt.Errorf("value %d (%g) is not a finite float32", i, v)
		}
		vals[i] = f
	}
	return updates.Row{Table: *l.Table, ID: int(*l.ID), Values: vals}, nil
}

type pushResult struct {
	rows, messages    int
	firstSeq, lastSeq uint64
	lastAck           time.Time
}

// publishRows publishes src's rows, perMessage a message, each with an
// acknowledgement, in order.
func publishRows(ctx context.Context, js jetstream.JetStream, subject string, dim, perMessage int, src rowSource) (pushResult, error) {
	var res pushResult
	batch := make([]updates.Row, perMessage)
	var buf []byte
	for {
		n := src.next(batch)
		if n == 0 {
			return res, nil
		}
		var err error
		buf, err = updates.Append(buf[:0], dim, batch[:n])
		if err != nil {
			return res, fmt.Errorf("update push: message %d: %w", res.messages+1, err)
		}
		// No headers: the stream's MaxMsgSize is a full message's payload
		// exactly, and JetStream counts header bytes against it, so a
		// message id would get a message of updates.MaxRows refused.
		// Retries are few (the client retries only when no stream
		// answered), and a row written twice holds the same values.
		ack, err := js.Publish(ctx, subject, buf)
		if err != nil {
			return res, fmt.Errorf("update push: publish message %d of %d rows to %s after %d messages: %w", res.messages+1, n, subject, res.messages, cause(ctx, err))
		}
		res.lastAck = time.Now()
		if res.messages == 0 {
			res.firstSeq = ack.Sequence
		}
		res.lastSeq = ack.Sequence
		res.messages++
		res.rows += n
	}
}

// waitApplied asks every process for its status every waitPoll until each
// embedder that follows subject has applied seq, and returns the lowest
// applied sequence among them and how long after lastAck the last of them
// was seen to have applied seq. Embedders are told apart by their status
// id; one that has not answered within waitQuorum of the first request is
// not waited for.
func waitApplied(ctx context.Context, nc *nats.Conn, subject string, seq uint64, lastAck time.Time) (uint64, time.Duration, error) {
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return 0, 0, err
	}
	defer sub.Unsubscribe()
	type follower struct {
		st      control.Status
		reached time.Time // when it was first seen at seq or later
	}
	followers := map[string]*follower{}
	start := time.Now()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	request := func() error { return nc.PublishRequest(control.SubjectStatus, inbox, nil) }
	if err := request(); err != nil {
		return 0, 0, err
	}
	for {
		select {
		case m := <-ch:
			var st control.Status
			if json.Unmarshal(m.Data, &st) != nil || st.Updates == nil || st.Updates.Subject != subject {
				continue
			}
			f := followers[st.ID]
			if f == nil {
				f = &follower{}
				followers[st.ID] = f
			}
			f.st = st
			if f.reached.IsZero() && st.Updates.Applied >= seq {
				f.reached = time.Now()
			}
		case <-tick.C:
			if time.Since(start) >= waitQuorum && len(followers) > 0 {
				applied, last, all := uint64(math.MaxUint64), time.Time{}, true
				for _, f := range followers {
					applied = min(applied, f.st.Updates.Applied)
					if f.reached.IsZero() {
						all = false
					} else if f.reached.After(last) {
						last = f.reached
					}
				}
				if all {
					return applied, max(last.Sub(lastAck), 0), nil
				}
			}
			if err := request(); err != nil {
				return 0, 0, err
			}
		case <-ctx.Done():
			if len(followers) == 0 {
				return 0, 0, fmt.Errorf("no embedder follows %s (none answered, its updates are off, or it serves another model): %w", subject, cause(ctx, ctx.Err()))
			}
			for _, f := range followers {
				if f.reached.IsZero() {
					u := f.st.Updates
					return 0, 0, fmt.Errorf("embedder %s applied up to sequence %d of %d (pending=%d refused=%d caught_up=%v%s): %w",
						f.st.ID, u.Applied, seq, u.Pending, u.Refused, u.CaughtUp, errDetail(u.Error), cause(ctx, ctx.Err()))
				}
			}
			return 0, 0, cause(ctx, ctx.Err())
		}
	}
}

func errDetail(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(" error=%q", s)
}
