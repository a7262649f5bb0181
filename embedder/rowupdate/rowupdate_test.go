package rowupdate

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/recmesh/recmesh/proto/updates"
)

func startJetStream(t *testing.T, dir string) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func connect(t *testing.T, ns *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// sink is a fake store: it records the first value of every applied row
// and refuses rows of table 99.
type sink struct {
	mu   sync.Mutex
	rows map[[2]int]float32
}

func (s *sink) apply(m updates.Message) error {
	v := make([]float32, m.Dim())
	for i := range m.Len() {
		if t, _ := m.Row(i); t == 99 {
			return errors.New("no table 99")
		}
		if err := m.Values(i, v); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range m.Len() {
		t, id := m.Row(i)
		_ = m.Values(i, v)
		s.rows[[2]int{t, id}] = v[0]
	}
	return nil
}

func (s *sink) get(t, id int) (float32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.rows[[2]int{t, id}]
	return v, ok
}

func publish(t *testing.T, js jetstream.JetStream, subject string, rows ...updates.Row) uint64 {
	t.Helper()
	b, err := updates.Append(nil, 4, rows)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(context.Background(), subject, b)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// newStream starts a JetStream server with the updates stream on it; ctx
// ends with the test.
func newStream(t *testing.T) (jetstream.JetStream, context.Context) {
	t.Helper()
	ns := startJetStream(t, t.TempDir())
	_, js := connect(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, updates.StreamConfig(0)); err != nil {
		t.Fatal(err)
	}
	return js, ctx
}

func row(table, id int, v float32) updates.Row {
	return updates.Row{Table: table, ID: id, Values: []float32{v, v, v, v}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestConsumerAppliesRefusesAndReplays runs the consumer against a real
// JetStream server: good messages are applied in order and acknowledged,
// bad ones refused and counted without stopping it, the applied sequence
// is recorded, and a new consumer that follows from a base replays exactly
// the messages after it, reaching the same rows.
func TestConsumerAppliesRefusesAndReplays(t *testing.T) {
	ns := startJetStream(t, t.TempDir())
	_, js := connect(t, ns)
	subject, _ := updates.RowsSubject("m1")
	other, _ := updates.RowsSubject("m2")

	s := &sink{rows: map[[2]int]float32{}}
	var recorded sync.Map
	reg := prometheus.NewRegistry()
	c := New(Options{JS: js, Apply: s.apply, Registry: reg, Record: func(seq uint64) error { recorded.Store("seq", seq); return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	caught, err := c.Follow("m1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- c.Run(ctx) }()
	select {
	case <-caught:
	case <-time.After(20 * time.Second):
		t.Fatal("an empty stream never reported caught up")
	}

	s1 := publish(t, js, subject, row(0, 1, 1), row(2, 3, 1))
	publish(t, js, other, row(0, 1, 77)) // another model's: never applied
	bad := publish(t, js, subject, row(0, 1, 5), row(99, 0, 5))
	if _, err := js.Publish(ctx, subject, []byte("not an update")); err != nil {
		t.Fatal(err)
	}
	last := publish(t, js, subject, row(0, 1, 2))
	waitFor(t, "the last message applied", func() bool { return c.Applied() >= last })
	st := c.Status()
	if st.Refused != 2 || st.Rows != 3 || st.Pending != 0 || !st.CaughtUp || st.Subject != subject {
		t.Fatalf("status %+v: want 2 refused, 3 rows, caught up on %s", st, subject)
	}
	if v, _ := s.get(0, 1); v != 2 {
		t.Fatalf("row (0,1) = %v, want the last update's 2 (the refused message's 5 must not land, nor the other model's 77)", v)
	}
	if v, _ := s.get(2, 3); v != 1 {
		t.Fatalf("row (2,3) = %v, want 1", v)
	}
	if c.Applied() < bad {
		t.Fatal("applied sequence behind a refused message")
	}
	// Every message of m1 handled, applied or refused, has its time to
	// visibility observed, and none of the other model's.
	if n, max := visibleObservations(t, reg); n != 4 || max <= 0 || max > 20 {
		t.Fatalf("visibility histogram: %d observations, largest bucket reached %gs; want 4, within the test's time", n, max)
	}

	// The consumer was acknowledging: the durable has nothing pending.
	cons, err := js.Consumer(ctx, updates.Stream, "embedder-m1")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, _ := recorded.Load("seq"); v != last {
		t.Fatalf("recorded sequence %v, want %d", v, last)
	}

	// A restart on a bundle that includes s1 replays what came after it
	// and is caught up only once it reached the recorded sequence.
	s2 := &sink{rows: map[[2]int]float32{}}
	c2 := New(Options{JS: js, Apply: s2.apply})
	caught, err = c2.Follow("m1", s1, last)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() { _ = c2.Run(ctx2) }()
	select {
	case <-caught:
	case <-time.After(20 * time.Second):
		t.Fatal("replay never caught up")
	}
	if c2.Applied() != last {
		t.Fatalf("replay applied up to %d, want %d", c2.Applied(), last)
	}
	if _, ok := s2.get(2, 3); ok {
		t.Fatal("replay applied a message the bundle already includes")
	}
	if v, _ := s2.get(0, 1); v != 2 {
		t.Fatalf("replayed row (0,1) = %v, want 2", v)
	}
}

// TestConsumerSurvivesServerRestart restarts the NATS server (same store)
// under the consumer: it recreates its consumer from the last applied
// sequence and applies what is published afterwards, skipping nothing.
func TestConsumerSurvivesServerRestart(t *testing.T) {
	dir := t.TempDir()
	ns := startJetStream(t, dir)
	port := ns.Addr().(*net.TCPAddr).Port
	_, js := connect(t, ns)
	subject, _ := updates.RowsSubject("m1")
	s := &sink{rows: map[[2]int]float32{}}
	c := New(Options{JS: js, Apply: s.apply})
	if _, err := c.Follow("m1", 0, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	first := publish(t, js, subject, row(0, 0, 1))
	waitFor(t, "the first update", func() bool { return c.Applied() >= first })

	ns.Shutdown()
	ns.WaitForShutdown()
	// The same port: the client reconnects to the server it knew.
	ns2, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ns2.Start()
	t.Cleanup(func() { ns2.Shutdown(); ns2.WaitForShutdown() })
	if !ns2.ReadyForConnections(10 * time.Second) {
		t.Fatal("restarted server not ready")
	}
	var last uint64
	waitFor(t, "a publish after the restart", func() bool {
		b, _ := updates.Append(nil, 4, []updates.Row{row(0, 0, 2), row(1, 1, 2)})
		ack, err := js.Publish(ctx, subject, b)
		if err != nil {
			return false
		}
		last = ack.Sequence
		return true
	})
	waitFor(t, "the update after the restart", func() bool { return c.Applied() >= last })
	if v, _ := s.get(1, 1); v != 2 {
		t.Fatalf("row (1,1) = %v after the restart, want 2", v)
	}
}

// TestHoldSeesTablesAtApplied reads the tables through Hold while a
// backlog is applied: every read must find exactly the state after the
// sequence Hold passes, as a hash compared across a replay needs. Each
// message sets row (0,0) to its own sequence, and applying it takes a
// moment between the write and the return, as copying a large message
// does.
func TestHoldSeesTablesAtApplied(t *testing.T) {
	js, ctx := newStream(t)
	subject, _ := updates.RowsSubject("m")
	// The stream's sequences start at 1, so message k carries value k.
	const n = 200
	for k := 1; k <= n; k++ {
		publish(t, js, subject, row(0, 0, float32(k)))
	}
	s := &sink{rows: map[[2]int]float32{}}
	c := New(Options{JS: js, Apply: func(m updates.Message) error {
		err := s.apply(m)
		time.Sleep(200 * time.Microsecond)
		return err
	}})
	caught, err := c.Follow("m", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	var reads, mismatches int
	for done := false; !done; {
		select {
		case <-caught:
			done = true
		default:
		}
		c.Hold(func(applied uint64) {
			v, ok := s.get(0, 0)
			reads++
			if applied == 0 && ok || applied != 0 && v != float32(applied) {
				mismatches++
				if mismatches == 1 {
					t.Errorf("Hold passed sequence %d, the tables hold message %v's row", applied, v)
				}
			}
		})
		time.Sleep(50 * time.Microsecond)
	}
	if c.Applied() != n {
		t.Fatalf("caught up at %d, want %d", c.Applied(), n)
	}
	if mismatches > 0 {
		t.Fatalf("%d of %d reads saw tables other than Hold's sequence says", mismatches, reads)
	}
}

// TestHandoffReplaysBeforeTheSwitch rolls the consumer over from model a
// to model b while both models' updates keep coming, as a rollout does:
// when b's tables start serving they must hold every b update published
// before the handoff began, none of a's updates may ever reach them (not
// even one the consumer had already fetched for a), and b's updates after
// the switch must follow on from where the replay ended, none skipped.
func TestHandoffReplaysBeforeTheSwitch(t *testing.T) {
	js, ctx := newStream(t)
	subA, _ := updates.RowsSubject("a")
	subB, _ := updates.RowsSubject("b")
	// Model a's rows are in table 0, b's in table 1; the k-th update of a
	// model writes row k with value k.
	var nA, nB atomic.Int64
	pub := func(subject string, table int, n *atomic.Int64) error {
		k := n.Add(1)
		b, err := updates.Append(nil, 4, []updates.Row{row(table, int(k), float32(k))})
		if err != nil {
			return err
		}
		_, err = js.Publish(ctx, subject, b)
		return err
	}
	for range 100 {
		if err := errors.Join(pub(subA, 0, &nA), pub(subB, 1, &nB)); err != nil {
			t.Fatal(err)
		}
	}
	a := &sink{rows: map[[2]int]float32{}}
	b := &sink{rows: map[[2]int]float32{}}
	var serving atomic.Pointer[sink] // the embedder's current store
	serving.Store(a)
	// Slow applies keep a's messages fetched and waiting during the
	// handoff.
	c := New(Options{JS: js, Apply: func(m updates.Message) error {
		time.Sleep(100 * time.Microsecond)
		return serving.Load().apply(m)
	}})
	caught, err := c.Follow("a", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	select {
	case <-caught:
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer did not catch up with model a")
	}

	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := errors.Join(pub(subA, 0, &nA), pub(subB, 1, &nB)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	before := int(nB.Load()) // b updates published before the handoff
	var prefix int
	applied, err := c.Handoff(ctx, "b", 0, b.apply, func(applied uint64) error {
		prefix = b.prefix(1)
		serving.Store(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if prefix < before {
		t.Errorf("b's tables served holding b's updates 1..%d; %d were published before the handoff", prefix, before)
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	<-stopped
	total := int(nB.Load())
	deadline := time.Now().Add(20 * time.Second)
	for b.prefix(1) < total && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.prefix(1); got < total {
		t.Fatalf("b's tables hold b's updates 1..%d of %d: the consumer skipped some after the handoff (replay ended at sequence %d)", got, total, applied)
	}
	if n := b.count(0); n != 0 {
		t.Fatalf("%d of model a's rows were written into model b's tables", n)
	}
}

// prefix is the largest k such that rows 1..k of table hold values 1..k.
func (s *sink) prefix(table int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for {
		if v, ok := s.rows[[2]int{table, k + 1}]; !ok || v != float32(k+1) {
			return k
		}
		k++
	}
}

// count is the number of rows of table the sink holds.
func (s *sink) count(table int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.rows {
		if k[0] == table {
			n++
		}
	}
	return n
}

// TestEmbeddersSharingAServerEachApplyEveryUpdate runs two embedders'
// consumers of one model against one server, as the serving pods of a
// scaled-out mesh do: each must apply every update (with one durable
// between them they split the messages, and each one's start deleted the
// other's), and each durable is reaped once nobody pulls from it.
func TestEmbeddersSharingAServerEachApplyEveryUpdate(t *testing.T) {
	js, ctx := newStream(t)
	subject, _ := updates.RowsSubject("m")
	const n = 100
	for k := 1; k <= n/2; k++ {
		publish(t, js, subject, row(0, k, float32(k)))
	}
	sinks := []*sink{{rows: map[[2]int]float32{}}, {rows: map[[2]int]float32{}}}
	var names []string
	for i, s := range sinks {
		c := New(Options{JS: js, Apply: s.apply, Instance: []string{"pod-a", "pod-b"}[i]})
		if _, err := c.Follow("m", 0, 0); err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Run(ctx) }()
		waitFor(t, "a consumer's status", func() bool { return c.Status().Consumer != "" })
		names = append(names, c.Status().Consumer)
	}
	if names[0] == names[1] {
		t.Fatalf("both embedders consume as %s", names[0])
	}
	for k := n/2 + 1; k <= n; k++ {
		publish(t, js, subject, row(0, k, float32(k)))
	}
	for i, s := range sinks {
		deadline := time.Now().Add(20 * time.Second)
		for s.prefix(0) < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := s.prefix(0); got < n {
			t.Fatalf("embedder %s applied updates 1..%d of %d", names[i], got, n)
		}
	}
	for _, name := range names {
		cons, err := js.Consumer(ctx, updates.Stream, name)
		if err != nil {
			t.Fatal(err)
		}
		if th := cons.CachedInfo().Config.InactiveThreshold; th != inactiveThreshold {
			t.Errorf("durable %s: inactive threshold %v, want %v", name, th, inactiveThreshold)
		}
	}
}

// TestFollowingTheSameTargetAgain: a target set again with the same model
// and sequences is a new one, so messages fetched for the first no longer
// pass for it.
func TestFollowingTheSameTargetAgain(t *testing.T) {
	c := New(Options{Apply: func(updates.Message) error { return nil }})
	if _, err := c.Follow("m", 5, 5); err != nil {
		t.Fatal(err)
	}
	first := c.cur
	if _, err := c.Follow("m", 5, 5); err != nil {
		t.Fatal(err)
	}
	if c.following(first) {
		t.Fatal("a message fetched for the first target passes for the second")
	}
	if !c.following(c.cur) {
		t.Fatal("the current target is not followed")
	}
}

func TestInstanceNames(t *testing.T) {
	for _, bad := range []string{"a.b", "a b", "a*", "a>", "a/b", "a\\b", "a\tb"} {
		if err := CheckInstance(bad); err == nil {
			t.Errorf("CheckInstance(%q) = nil", bad)
		}
	}
	for _, good := range []string{"", "pod-7d9f_x", "recmesh-serving-5c6b9-abcde-recmesh"} {
		if err := CheckInstance(good); err != nil {
			t.Errorf("CheckInstance(%q) = %v", good, err)
		}
	}
	name := DefaultInstance("my.seg/ment")
	if err := CheckInstance(name); err != nil {
		t.Errorf("DefaultInstance gave %q: %v", name, err)
	}
	if !strings.HasSuffix(name, "-my_seg_ment") {
		t.Errorf("DefaultInstance(%q) = %q, want the segment at its end", "my.seg/ment", name)
	}
}

// visibleObservations reads recmesh_embedder_update_visible_seconds from
// reg: its count, and the upper bound of the lowest bucket holding every
// observation.
func visibleObservations(t *testing.T, reg *prometheus.Registry) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "recmesh_embedder_update_visible_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() == h.GetSampleCount() {
				return h.GetSampleCount(), b.GetUpperBound()
			}
		}
		return h.GetSampleCount(), math.Inf(1)
	}
	t.Fatal("no recmesh_embedder_update_visible_seconds registered")
	return 0, 0
}
