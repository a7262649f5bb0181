package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	registerUpdate(&updateCommand{
		name:    "status",
		summary: "where the embedder stands in its model's row updates: applied sequence, pending, lag, refusals (--hash: a hash of the serving tables)",
		run:     runUpdateStatus,
	})
}

// statusCollect is how long update status collects answers, as recmesh
// status does by default.
const statusCollect = 500 * time.Millisecond

// tablesHashTimeout bounds --hash: the embedder reads every byte of its
// tables to answer.
const tablesHashTimeout = 60 * time.Second

func runUpdateStatus(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("update status", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL)")
	hash := fs.Bool("hash", false, "also ask the embedder for a hash of its serving tables (it reads every byte, up to a minute on large tables; the operator's identity only)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	nc, err := control.Dial(*natsURL, "recmesh-update-status")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := failOnRefusal(ctx, nc)
	defer stop()
	sts, err := control.Gather(ctx, nc, statusCollect)
	if err != nil {
		return fmt.Errorf("update status: %w", cause(ctx, err))
	}
	var embedders []control.Status
	for _, st := range sts {
		if st.Service == control.ServiceEmbedder {
			embedders = append(embedders, st)
		}
	}
	if len(embedders) == 0 {
		return fmt.Errorf("update status: no embedder answered on %s within %v", *natsURL, statusCollect)
	}
	// One line per embedder: a mesh has one, a cluster of serving pods
	// on one NATS has one per pod.
	sort.Slice(embedders, func(i, j int) bool { return embedders[i].ID < embedders[j].ID })
	var off []string
	var lines []string
	for _, st := range embedders {
		u := st.Updates
		if u == nil {
			off = append(off, fmt.Sprintf("%s (pid %d on %s)", st.ID, st.PID, st.Host))
			continue
		}
		lines = append(lines, fmt.Sprintf("updates: model=%s subject=%s base=%d applied=%d pending=%d lag_s=%.3f rows_applied=%d refused=%d caught_up=%v",
			st.ModelID, u.Subject, u.Base, u.Applied, u.Pending, u.LagSeconds, u.Rows, u.Refused, u.CaughtUp)+consumerDetail(u.Consumer)+errDetail(u.Error))
	}
	if len(lines) == 0 {
		return fmt.Errorf("update status: row updates are off in the embedder %v (it runs without JetStream or with updates disabled)", off)
	}
	if *hash {
		rep, err := tablesHash(ctx, nc)
		if err != nil {
			return err
		}
		// The hash is of the tables at rep.Applied, which may be past the
		// status taken just before.
		last := &lines[len(lines)-1]
		*last += " tables_hash=" + rep.Hash
		if len(lines) == 1 && rep.Applied != embedders[0].Updates.Applied {
			*last += fmt.Sprintf(" hash_applied=%d", rep.Applied)
		}
	}
	for _, l := range lines {
		fmt.Fprintln(e.stdout, l)
	}
	if len(off) > 0 {
		fmt.Fprintf(e.stderr, "update status: row updates are off in %v\n", off)
	}
	return nil
}

// tablesHash asks the embedder for the hash of its serving tables.
func tablesHash(ctx context.Context, nc *nats.Conn) (control.TablesHashReply, error) {
	ctx, cancel := context.WithTimeout(ctx, tablesHashTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, control.SubjectTablesHash, nil)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return control.TablesHashReply{}, fmt.Errorf("update status --hash: no embedder answers %s (one without row updates, or older than this command)", control.SubjectTablesHash)
		}
		return control.TablesHashReply{}, fmt.Errorf("update status --hash: %s: %w (only the operator's identity may ask)", control.SubjectTablesHash, cause(ctx, err))
	}
	var rep control.TablesHashReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return rep, fmt.Errorf("update status --hash: reply does not decode: %w", err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("update status --hash: the embedder: %s", rep.Error)
	}
	if rep.Hash == "" {
		return rep, errors.New("update status --hash: the embedder's reply has no hash")
	}
	return rep, nil
}

// consumerDetail names the embedder's durable consumer, when it reports
// one.
func consumerDetail(name string) string {
	if name == "" {
		return ""
	}
	return " consumer=" + name
}
