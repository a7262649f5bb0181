package e2e

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/shm"
)

// hostileEnv makes the test binary a hostile frontend instead of running
// tests: "<segment path>,<seconds>,<seed>,<pause file>"; while the pause
// file exists it leaves the segment file's size alone (the test measures
// hang detection then, which a new generation would reset). make chaos starts it, kills it
// and starts it again, as a compromised frontend would behave.
const hostileEnv = "RECMESH_CHAOS_HOSTILE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(hostileEnv); spec != "" {
		os.Exit(runHostile(spec))
	}
	os.Exit(m.Run())
}

// runHostile holds a lane of whatever generation is at the path and, until
// its time is up, does one hostile thing after another: random words into
// its lane's control block (ring counters, entries, slot headers) and
// arena (payloads), garbage requests committed, the segment file
// truncated or extended, a slot left half-written. It prints "actions N"
// as it goes, so a kill loses at most a few from the count.
func runHostile(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "hostile: want path,seconds,seed,pause-file")
		return 2
	}
	pauseFile = parts[3]
	path := parts[0]
	secs, _ := strconv.Atoi(parts[1])
	seed, _ := strconv.ParseUint(parts[2], 10, 64)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	end := time.Now().Add(time.Duration(secs) * time.Second)
	actions := 0
	report := func() { fmt.Printf("actions %d\n", actions) }
	defer report()
	for time.Now().Before(end) {
		seg, err := shm.Attach(path, shm.AttachOptions{})
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		lane, err := seg.ClaimLane(os.Getpid())
		if err != nil {
			seg.Close()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		// One generation until it is lost (we or the embedder end it).
		_ = shm.GuardFaults(func() error {
			for k := 0; k < 200 && time.Now().Before(end); k++ {
				hostileAction(rng, path, seg, lane)
				actions++
				if actions%20 == 0 {
					report()
				}
				time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
			}
			return nil
		})
		_ = shm.GuardFaults(func() error { _ = lane.Release(); return seg.Close() })
	}
	return 0
}

func hostileAction(rng *rand.Rand, path string, seg *shm.Segment, lane *shm.Lane) {
	scribble := func(b []byte, words int) {
		for i := 0; i < words && len(b) >= 8; i++ {
			off := rng.IntN(len(b)-7) &^ 7
			binary.LittleEndian.PutUint64(b[off:], rng.Uint64())
		}
	}
	switch p := rng.IntN(100); {
	case p < 35: // the lane's own control words
		scribble(lane.ControlBlock(), 1+rng.IntN(4))
	case p < 55: // its payloads
		scribble(lane.Arena(), 1+rng.IntN(16))
	case p < 85: // a request of garbage, committed
		n := 1 + rng.IntN(16)
		slot, payload, err := lane.Claim(n, n*seg.Geometry().ExampleBytes)
		if err != nil {
			return
		}
		for i := range payload {
			payload[i] = byte(rng.Uint32())
		}
		_ = lane.Commit(slot, shm.RequestMeta{ID: rng.Uint64(), Deadline: time.Now().Add(time.Second).UnixNano()})
	case p < 93: // a slot claimed, half-written, held
		n := 1 + rng.IntN(16)
		if _, payload, err := lane.Claim(n, n*seg.Geometry().ExampleBytes); err == nil {
			copy(payload[:len(payload)/2], make([]byte, len(payload)/2))
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		}
	case time.Since(lastFileAction) < fileActionEvery || paused():
		scribble(lane.ControlBlock(), 1)
	case p < 97: // the file extended
		lastFileAction = time.Now()
		if fi, err := os.Stat(path); err == nil {
			_ = os.Truncate(path, fi.Size()+int64(rng.IntN(1<<20)))
		}
	default: // the file cut short, which ends the whole generation
		lastFileAction = time.Now()
		if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
			_ = os.Truncate(path, rng.Int64N(fi.Size()))
		}
	}
}

// The file is resized at most this often: each cut costs every lane its
// generation, and the point is to survive it, not to measure a mesh that
// does nothing else.
const fileActionEvery = 3 * time.Second

var (
	lastFileAction = time.Now()
	pauseFile      string
)

func paused() bool {
	_, err := os.Stat(pauseFile)
	return err == nil
}
