package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsProcessEnv makes the test binary a NATS server with JetStream
// ("port,store directory") until SIGTERM: startJetStreamProcess runs one
// apart from the test, as production runs NATS apart from its clients.
const natsProcessEnv = "RECMESH_E2E_NATS_PROCESS"

// startJetStreamProcess starts a NATS server with JetStream (file store
// in a temporary directory) in a process of its own, which inherits this
// process's CPU affinity, and stops it when the test ends. A bench whose
// load and trainer share a process with the server has every message's
// parse and copy queued behind the load's goroutines on the same Go
// scheduler; in a process of its own the kernel shares the core between
// them at a much finer grain.
func startJetStreamProcess(t *testing.T) string {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%s", natsProcessEnv, port, t.TempDir()))
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the NATS process: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, 30*time.Second, "the NATS process to accept connections", func() bool {
		select {
		case <-done:
			t.Fatalf("the NATS process exited: %s", out)
		default:
		}
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	return url
}

// runNATSProcess is the NATS process's main (see natsProcessEnv).
func runNATSProcess(spec string) int {
	portStr, store, ok := strings.Cut(spec, ",")
	port, err := strconv.Atoi(portStr)
	if !ok || err != nil || store == "" {
		fmt.Fprintf(os.Stderr, "%s: want port,store directory, got %q\n", natsProcessEnv, spec)
		return 2
	}
	ns, err := natsserver.NewServer(jetStreamOptions(port, store))
	if err != nil {
		fmt.Fprintf(os.Stderr, "nats process: %v\n", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats process: not ready in 20 s")
		return 1
	}
	<-sig
	ns.Shutdown()
	ns.WaitForShutdown()
	return 0
}

// TestNATSProcessServesJetStream starts the separate NATS process and
// uses its JetStream: the bench depends on it.
func TestNATSProcessServesJetStream(t *testing.T) {
	url := startJetStreamProcess(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "probe", Subjects: []string{"probe.>"}}); err != nil {
		t.Fatalf("JetStream in the NATS process: %v", err)
	}
	ack, err := js.Publish(ctx, "probe.a", []byte("x"))
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("publish to the NATS process's stream: %v (%+v)", err, ack)
	}
}
