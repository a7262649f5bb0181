package server

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/shm"
)

// FuzzBatchEntries feeds the accelerator's batch serving (genLoop's
// serveBatch, the loop's own step) batches whose example count and entries table a hostile
// or buggy embedder chose, against a lane with requests in flight. Each
// entry is 6 fuzz bytes: lane (offset from the frontend's), slot, epoch
// (offset from the lane's, as a signed byte), first row, rows, status. The server must never panic or
// end the generation over them, and every completion the frontend accepts
// must be for a request in flight, with a defined status, and, when OK,
// carry the scores of rows an entry for that request named.
//
//	go test -run=NONE -fuzz='^FuzzBatchEntries$' -fuzztime=10s ./accelerator/server/
func FuzzBatchEntries(f *testing.F) {
	dir := os.TempDir()
	if unix.Access(shm.DefaultDir, unix.W_OK) == nil {
		dir = shm.DefaultDir // tmpfs: a segment per input is cheap there
	}
	prog := newFakeProgram()
	cfg := prog.Config()
	srv := newServer(Options{}, prog)
	times := newExecTimes(prog.Buckets())
	name := fmt.Sprintf("recmesh-fuzz-batch-%d", os.Getpid())

	// The requests in flight: slots 0, 1, 2 of the frontend's lane, with
	// 1, 2, 3 examples.
	f.Add(uint8(6), []byte{0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 2, 0, 0, 2, 0, 3, 3, 0})
	f.Add(uint8(3), []byte{0, 1, 0, 1, 2, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 2})
	f.Add(uint8(0), []byte{0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 6})
	f.Add(uint8(9), []byte{0, 0, 0, 0, 1, 0})
	f.Add(uint8(4), []byte{1, 0, 0, 0, 1, 0, 0, 9, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 3, 2, 0, 0, 0, 0xff, 0, 1, 0})
	f.Add(uint8(2), []byte{0, 1, 0, 0, 2, 0, 0, 1, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, examples uint8, table []byte) {
		seg, err := shm.Create(shm.Options{Name: name, Dir: dir, ModelID: cfg.ID(), Geometry: testGeometry(cfg)})
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Remove()
		defer seg.Close()
		g := &generation{t: t, cfg: cfg, seg: seg, bw: seg.BatchWriter()}
		if g.lane, err = seg.ClaimLane(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		if g.rr, err = seg.RequestReader(g.lane.Index()); err != nil {
			t.Fatal(err)
		}
		inFlight := map[int]shm.Request{}
		for n := 1; n <= 3; n++ {
			r := g.submit(n)
			inFlight[r.Slot] = r
		}
		epoch, lane := g.lane.Epoch(), g.lane.Index()
		var entries []shm.BatchEntry
		for len(table) >= 6 && len(entries) < seg.Geometry().MaxBatchEntries {
			entries = append(entries, shm.BatchEntry{
				Lane: int(table[0]) + lane, Slot: int(table[1]), Epoch: epoch + uint32(int8(table[2])),
				FirstRow: int(table[3]), Rows: int(table[4]), Status: shm.Status(table[5]),
			})
			table = table[6:]
		}
		seq := g.publish(int(examples), entries...)

		l, err := srv.newLoop(seg, prog, times, shm.NewPulse())
		if err != nil {
			t.Fatal(err)
		}
		defer l.close()
		b, ok, err := l.reader.Poll()
		if !ok || err != nil {
			t.Fatalf("the published batch: %v, %v", ok, err)
		}
		if err := l.serveBatch(b); err != nil {
			t.Fatalf("serveBatch ended the generation: %v", err)
		}
		if seg.CompletedSeq() != seq {
			t.Fatalf("completed seq %d after serving batch %d", seg.CompletedSeq(), seq)
		}

		for {
			c, ok, err := g.lane.Poll()
			if err != nil {
				// Two entries for one request complete it twice: the
				// frontend refuses the second, which is its defence.
				continue
			}
			if !ok {
				break
			}
			req, known := inFlight[c.Slot]
			if !known || c.Epoch != epoch {
				t.Fatalf("completion %+v for nothing in flight", c)
			}
			if c.Status != shm.StatusOK {
				continue
			}
			sc := g.scores(c.Slot)
			matched := false
			for _, e := range entries {
				if e.Lane == lane && e.Slot == c.Slot && e.Epoch == epoch && e.Rows == req.Examples && e.Status == shm.StatusOK && scoresOf(sc, int(seq), e.FirstRow) {
					matched = true
				}
			}
			if !matched {
				t.Fatalf("slot %d completed OK with scores %v that no entry for it names", c.Slot, sc)
			}
		}
	})
}

// scoresOf reports whether sc are the scores of batch seq's rows from first.
func scoresOf(sc []float32, seq, first int) bool {
	for i, v := range sc {
		if v != rowScore(seq, first+i) {
			return false
		}
	}
	return true
}
