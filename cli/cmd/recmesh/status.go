package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	register(&command{
		name:    "status",
		summary: "show every mesh process on the control plane: state, generation, lanes, queue depth",
		run:     runStatus,
	})
}

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL)")
	// Not --wait: that is update push's and update dense's switch, and
	// every flag's environment twin (RECMESH_WAIT) is shared.
	collect := fs.Duration("collect", 500*time.Millisecond, "how long to collect answers")
	asJSON := fs.Bool("json", false, "print the answers as JSON")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	nc, err := control.Dial(*natsURL, "recmesh-status")
	if err != nil {
		return err
	}
	defer nc.Close()
	sts, err := control.Gather(ctx, nc, *collect)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	sort.Slice(sts, func(i, j int) bool {
		if sts[i].Service != sts[j].Service {
			return sts[i].Service < sts[j].Service
		}
		return sts[i].PID < sts[j].PID
	})
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sts)
	}
	if len(sts) == 0 {
		return fmt.Errorf("status: no recmesh process answered on %s within %v", *natsURL, *collect)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tPID\tSTATE\tREADY\tGENERATION\tLANES\tQUEUE\tDETAIL")
	for _, s := range sts {
		lanes := "-"
		if len(s.Lanes) > 0 {
			lanes = fmt.Sprintf("%d/%d", s.LanesInUse(), len(s.Lanes))
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%v\t%d\t%s\t%d\t%s\n", s.Service, s.PID, s.State, s.Ready, s.Generation, lanes, s.QueueDepth, s.Detail)
	}
	return w.Flush()
}
