package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

// testBundle writes a bundle's config.json (all update push reads of it)
// and returns its directory and configuration.
func testBundle(t *testing.T) (string, model.Config) {
	t.Helper()
	cfg := model.DLRMv2(100)
	cfg.Seed = 1
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.ConfigFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = model.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// startNATS starts the embedded JetStream server and makes role the
// identity commands run as (control.Dial reads the process environment).
func startNATS(t *testing.T, role control.Role) *meshnats.Server {
	t.Helper()
	s, err := meshnats.StartWith(meshnats.Options{Parent: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	t.Setenv(control.EnvNkey, s.Seed(role))
	return s
}

// connect connects as role, for the test's own side.
func connect(t *testing.T, s *meshnats.Server, role control.Role) *nats.Conn {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(s.Seed(role))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// streamRows reads messages first..last of the updates stream back, as the
// operator, and decodes their rows.
func streamRows(t *testing.T, s *meshnats.Server, subject string, first, last uint64) ([]updates.Row, [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(connect(t, s, control.RoleAdmin))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, updates.Stream)
	if err != nil {
		t.Fatal(err)
	}
	var rows []updates.Row
	var payloads [][]byte
	for seq := first; seq <= last; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		if m.Subject != subject {
			t.Errorf("message %d on %s, want %s", seq, m.Subject, subject)
		}
		msg, err := updates.Decode(m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		for i := range msg.Len() {
			tb, id := msg.Row(i)
			v := make([]float32, msg.Dim())
			if err := msg.Values(i, v); err != nil {
				t.Fatalf("message %d: %v", seq, err)
			}
			rows = append(rows, updates.Row{Table: tb, ID: id, Values: v})
		}
		payloads = append(payloads, m.Data)
	}
	return rows, payloads
}

func lastSeq(t *testing.T, s *meshnats.Server) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(connect(t, s, control.RoleAdmin))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, updates.Stream)
	if err != nil {
		return 0
	}
	si, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return si.State.LastSeq
}

var pushedRE = regexp.MustCompile(`^pushed rows=(\d+) messages=(\d+) first_seq=(\d+) last_seq=(\d+) subject=(\S+)( applied=(\d+) visible_ms=(\d+))?\n$`)

// pushed parses update push's summary line.
func pushed(t *testing.T, stdout string) (rows, messages int, first, last uint64, subject string, m []string) {
	t.Helper()
	m = pushedRE.FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("stdout %q is not one summary line", stdout)
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return atoi(m[1]), atoi(m[2]), uint64(atoi(m[3])), uint64(atoi(m[4])), m[5], m
}

// TestUpdatePushRandom: random rows land in the model's subject as
// --per-message sized messages, inside the model's tables and the export's
// value range, the same rows for the same seed; --table keeps to one
// table. The trainer's identity creates the stream.
func TestUpdatePushRandom(t *testing.T) {
	s := startNATS(t, control.RoleTrainer)
	dir, cfg := testBundle(t)
	subject, _ := updates.RowsSubject(cfg.ID())
	push := func(args ...string) (int, int, uint64, uint64) {
		t.Helper()
		code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_BUNDLE": dir},
			append([]string{"update", "push"}, args...)...)
		if code != exitOK {
			t.Fatalf("update push %v: exit %d: %s", args, code, stderr)
		}
		rows, messages, first, last, subj, _ := pushed(t, stdout)
		if subj != subject {
			t.Errorf("subject %s, want %s", subj, subject)
		}
		return rows, messages, first, last
	}
	rows, messages, first, last := push("--random", "2500", "--per-message", "1000", "--seed", "7")
	if rows != 2500 || messages != 3 || first != 1 || last != 3 {
		t.Fatalf("pushed rows=%d messages=%d seqs %d..%d; want 2500 rows in messages 1..3", rows, messages, first, last)
	}
	got, payloads := streamRows(t, s, subject, 1, 3)
	if len(got) != 2500 {
		t.Fatalf("the stream holds %d rows, want 2500", len(got))
	}
	tables := map[int]bool{}
	for i, r := range got {
		tables[r.Table] = true
		if r.Table >= len(cfg.VocabSizes) || r.ID >= cfg.VocabSizes[r.Table] || len(r.Values) != cfg.EmbeddingDim {
			t.Fatalf("row %d: table %d id %d width %d is not a row of the model", i, r.Table, r.ID, len(r.Values))
		}
		for _, v := range r.Values {
			if v < -0.05 || v >= 0.05 {
				t.Fatalf("row %d: value %v outside the export's ±0.05", i, v)
			}
		}
	}
	if len(tables) != len(cfg.VocabSizes) {
		t.Errorf("2500 random rows touched %d tables, want all %d", len(tables), len(cfg.VocabSizes))
	}

	// The same seed pushes the same rows, as new messages (not taken for
	// duplicates).
	if _, _, first, last = push("--random", "2500", "--per-message", "1000", "--seed", "7"); first != 4 || last != 6 {
		t.Fatalf("second push at %d..%d, want 4..6", first, last)
	}
	_, again := streamRows(t, s, subject, 4, 6)
	for i := range again {
		if string(again[i]) != string(payloads[i]) {
			t.Errorf("message %d of the same seed differs", i)
		}
	}

	rows, messages, first, _ = push("--random", "10", "--table", "5", "--seed", "8")
	if rows != 10 || messages != 1 || first != 7 {
		t.Fatalf("--table push: rows=%d messages=%d first=%d", rows, messages, first)
	}
	got, _ = streamRows(t, s, subject, 7, 7)
	for _, r := range got {
		if r.Table != 5 {
			t.Errorf("--table 5 pushed a row of table %d", r.Table)
		}
	}
}

// TestUpdatePushRowsFile: a --rows file's rows arrive exactly, under
// --model's subject.
func TestUpdatePushRowsFile(t *testing.T) {
	s := startNATS(t, control.RoleTrainer)
	dir, cfg := testBundle(t)
	var want []updates.Row
	var lines strings.Builder
	for i := range 5 {
		v := make([]float32, cfg.EmbeddingDim)
		for j := range v {
			v[j] = float32(i*1000+j) / 1024
		}
		r := updates.Row{Table: (i * 7) % len(cfg.VocabSizes), ID: i * 3, Values: v}
		want = append(want, r)
		b, _ := json.Marshal(map[string]any{"table": r.Table, "id": r.ID, "values": r.Values})
		lines.Write(b)
		lines.WriteString("\n")
		if i == 2 {
			lines.WriteString("\n") // blank lines are skipped
		}
	}
	file := filepath.Join(t.TempDir(), "rows.jsonl")
	if err := os.WriteFile(file, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()},
		"update", "push", "--bundle", dir, "--model", "m1", "--rows", file, "--per-message", "2")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows, messages, first, last, subject, _ := pushed(t, stdout)
	if rows != 5 || messages != 3 || first != 1 || last != 3 || subject != updates.SubjectPrefix+"m1" {
		t.Fatalf("summary %q; want 5 rows in 3 messages to m1's subject", stdout)
	}
	got, _ := streamRows(t, s, subject, 1, 3)
	if len(got) != len(want) {
		t.Fatalf("%d rows in the stream, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Table != want[i].Table || got[i].ID != want[i].ID || fmt.Sprint(got[i].Values) != fmt.Sprint(want[i].Values) {
			t.Errorf("row %d: got table %d id %d, want %+v", i, got[i].Table, got[i].ID, want[i].Table)
		}
	}
}

// TestUpdatePushBadInput: bad input is a usage error that names what is
// wrong (the line, for --rows), and nothing is published.
func TestUpdatePushBadInput(t *testing.T) {
	s := startNATS(t, control.RoleTrainer)
	dir, cfg := testBundle(t)
	row := func(table, id int, width int, v string) string {
		vals := make([]string, width)
		for i := range vals {
			vals[i] = "0.01"
		}
		if width > 0 && v != "" {
			vals[width-1] = v
		}
		return fmt.Sprintf(`{"table":%d,"id":%d,"values":[%s]}`, table, id, strings.Join(vals, ","))
	}
	good := row(0, 1, cfg.EmbeddingDim, "")
	rowsFile := func(lines ...string) string {
		f := filepath.Join(t.TempDir(), "rows.jsonl")
		if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	url := map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_BUNDLE": dir}
	for _, tc := range []struct {
		vars map[string]string
		args []string
		msg  string
	}{
		{url, []string{"--rows", rowsFile(good, row(26, 0, cfg.EmbeddingDim, ""))}, "line 2: table 26 is not one of the model's tables 0..25"},
		{url, []string{"--rows", rowsFile(good, good, row(3, 100, cfg.EmbeddingDim, ""))}, "line 3: id 100 is outside table 3's rows 0..99"},
		{url, []string{"--rows", rowsFile(row(3, -1, cfg.EmbeddingDim, ""))}, "line 1: id -1 is outside"},
		{url, []string{"--rows", rowsFile(good, row(0, 0, 127, ""))}, "line 2: 127 values, want the model's embedding_dim 128"},
		{url, []string{"--rows", rowsFile(row(0, 0, cfg.EmbeddingDim, "1e39"))}, "line 1: value 127 (1e+39) is not a finite float32"},
		{url, []string{"--rows", rowsFile(good, row(0, 0, cfg.EmbeddingDim, "NaN"))}, "line 2: not a row object"},
		{url, []string{"--rows", rowsFile(`{"table":1,"values":[]}`)}, `line 1: no "id"`},
		{url, []string{"--rows", rowsFile(`{"id":1,"values":[]}`)}, `line 1: no "table"`},
		{url, []string{"--rows", rowsFile(`{"table":1,"id":1,"values":[],"weight":2}`)}, `line 1: not a row object: json: unknown field "weight"`},
		{url, []string{"--rows", rowsFile(good + " " + good)}, "line 1: more than one JSON value"},
		{url, []string{"--rows", rowsFile("", "")}, "no rows"},
		{url, []string{"--rows", "/nonexistent/rows"}, "--rows: open /nonexistent/rows"},
		{url, []string{"--rows", rowsFile(good), "--table", "1"}, "--table selects the tables of --random rows"},
		{url, []string{"--rows", rowsFile(good), "--random", "3"}, "one of --rows FILE and --random N"},
		{url, nil, "one of --rows FILE and --random N"},
		{url, []string{"--random", "-3"}, "--random -3: want 1.."},
		{url, []string{"--random", "3", "--table", "26"}, "--table 26: the model has tables 0..25"},
		{url, []string{"--random", "3", "--per-message", "0"}, "--per-message 0: want 1..1024"},
		{url, []string{"--random", "3", "--per-message", "1025"}, "--per-message 1025: want 1..1024"},
		{url, []string{"--random", "3", "--model", "a.b"}, `--model: updates: model id "a.b" cannot be a subject token`},
		{url, []string{"--random", "3", "--bundle", "/nonexistent"}, "--bundle: model: bundle /nonexistent"},
		{map[string]string{"RECMESH_BUNDLE": dir}, []string{"--random", "3"}, "no NATS URL"},
		{map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_BUNDLE": dir, "RECMESH_PER_MESSAGE": "x"}, []string{"--random", "3"}, "RECMESH_PER_MESSAGE (flag -per-message)"},
	} {
		code, stdout, stderr := runT(t, tc.vars, append([]string{"update", "push"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.msg) || stdout != "" {
			t.Errorf("update push %v: exit %d, stdout %q, stderr %q; want exit %d naming %q", tc.args, code, stdout, stderr, exitUsage, tc.msg)
		}
	}
	if n := lastSeq(t, s); n != 0 {
		t.Errorf("bad input published %d messages", n)
	}
}

// TestUpdatePushRefused: an identity that may not publish updates fails
// at once, saying the server refused it, rather than waiting out its
// timeout.
func TestUpdatePushRefused(t *testing.T) {
	s := startNATS(t, control.RoleFrontend)
	dir, _ := testBundle(t)
	start := time.Now()
	code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL()},
		"update", "push", "--bundle", dir, "--random", "3", "--timeout", "1m")
	if code != exitFailure || stdout != "" || !strings.Contains(stderr, "refused this identity") {
		t.Errorf("as a frontend: exit %d, stdout %q, stderr %q; want a refusal", code, stdout, stderr)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if n := lastSeq(t, s); n != 0 {
		t.Errorf("a frontend published %d messages", n)
	}
}

// fakeEmbedder follows subject as the embedder does, with the embedder's
// identity: a durable pull consumer whose acknowledged sequence its status
// reports as Updates.Applied.
func fakeEmbedder(t *testing.T, s *meshnats.Server, modelID, subject string) *atomic.Uint64 {
	t.Helper()
	nc := connect(t, s, control.RoleEmbedder)
	var applied atomic.Uint64
	svc, err := control.Register(nc, control.ServiceEmbedder, "v1.0.0", func() control.Status {
		return control.Status{State: "ready", Ready: true, ModelID: modelID,
			Updates: &control.UpdatesStatus{Subject: subject, Applied: applied.Load(), CaughtUp: true}}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, updates.StreamConfig(0)); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, updates.Stream, jetstream.ConsumerConfig{
		Durable: "embedder-" + modelID, FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if _, err := updates.Decode(m.Data()); err != nil {
			t.Errorf("fake embedder: %v", err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Errorf("fake embedder: %v", err)
			return
		}
		_ = m.Ack()
		applied.Store(md.Sequence.Stream)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return &applied
}

// TestUpdatePushWait: --wait returns once the embedder has applied the
// last message, and reports it; without an embedder it fails after
// --timeout, having said what it pushed.
func TestUpdatePushWait(t *testing.T) {
	s := startNATS(t, control.RoleTrainer)
	dir, cfg := testBundle(t)
	subject, _ := updates.RowsSubject(cfg.ID())

	code, stdout, stderr := runT(t, map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_BUNDLE": dir},
		"update", "push", "--random", "5", "--wait", "--timeout", "2s")
	if code != exitFailure || !strings.Contains(stderr, "no embedder follows "+subject) {
		t.Errorf("--wait without an embedder: exit %d, stderr %q", code, stderr)
	}
	if _, _, _, last, _, m := pushed(t, stdout); last != 1 || m[6] != "" {
		t.Errorf("--wait without an embedder printed %q; want the push without applied=", stdout)
	}

	applied := fakeEmbedder(t, s, cfg.ID(), subject)
	// Full messages (the default --per-message): the stream takes a
	// message of updates.MaxRows rows.
	code, stdout, stderr = runT(t, map[string]string{"NATS_URL": s.ClientURL(), "RECMESH_BUNDLE": dir, "RECMESH_WAIT": "true"},
		"update", "push", "--random", "3000")
	if code != exitOK {
		t.Fatalf("--wait: exit %d: %s", code, stderr)
	}
	t.Logf("update push --wait: %s", stdout)
	_, messages, first, last, _, m := pushed(t, stdout)
	if messages != 3 || first != 2 || last != 4 || m[6] == "" {
		t.Fatalf("--wait printed %q; want messages 2..4 and applied=", stdout)
	}
	if got, _ := strconv.ParseUint(m[7], 10, 64); got != last {
		t.Errorf("applied=%d, want %d", got, last)
	}
	if a := applied.Load(); a != last {
		t.Errorf("the embedder applied %d, want %d", a, last)
	}
}
