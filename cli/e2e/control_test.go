package e2e

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/proto/control"
)

// TestE2EControlPlane checks what `nats micro ls` and `recmesh status` see
// of a running mesh: every process registered as a NATS micro service, and
// a status answer from each with its generation and (for the embedder)
// its lanes.
func TestE2EControlPlane(t *testing.T) {
	c := newCluster(t, "full")
	c.natsURL = startNATS(t)
	c.startMesh(2)

	nc, err := nats.Connect(c.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// $SRV.INFO is the micro discovery subject the NATS CLI uses.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.INFO", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var names []string
	for {
		m, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		var info struct {
			Name      string `json:"name"`
			Endpoints []struct {
				Subject string `json:"subject"`
			} `json:"endpoints"`
		}
		if err := json.Unmarshal(m.Data, &info); err != nil {
			t.Fatal(err)
		}
		names = append(names, info.Name)
	}
	sort.Strings(names)
	want := []string{control.ServiceAccelerator, control.ServiceEmbedder, control.ServiceFrontend, control.ServiceFrontend}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("micro services %v, want %v", names, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sts, err := control.Gather(ctx, nc, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 4 {
		t.Fatalf("%d status answers, want 4", len(sts))
	}
	var gen uint64
	for _, s := range sts {
		if !s.Ready || s.Generation == 0 {
			t.Errorf("%s pid %d: ready %v generation %d", s.Service, s.PID, s.Ready, s.Generation)
		}
		if gen == 0 {
			gen = s.Generation
		} else if s.Generation != gen {
			t.Errorf("%s is on generation %d, others on %d", s.Service, s.Generation, gen)
		}
		if s.Service == control.ServiceFrontend && !strings.Contains(s.Detail, "steering ebpf") && !strings.Contains(s.Detail, "steering kernel-hash") {
			t.Errorf("frontend pid %d: status detail %q names no steering mode", s.PID, s.Detail)
		}
		if s.Service == control.ServiceEmbedder {
			if used := s.LanesInUse(); used != 2 {
				t.Errorf("embedder reports %d lanes in use, want 2 (two frontends)", used)
			}
		}
	}
}
