package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// defaultHealthTimeout bounds one health check: container health checks
// have their own timeout, and this one answers first with a reason.
const defaultHealthTimeout = 3 * time.Second

func init() {
	register(&command{
		name:    "health",
		summary: "check a service's /healthz or gRPC health service (exit 0 healthy, 1 not)",
		run:     runHealth,
	})
}

// runHealth is the container health check of every recmesh image: the
// images carry no curl or grpc_health_probe, only this binary. Each check
// given must pass; the command prints one line per passed check.
func runHealth(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	httpURL := fs.String("http", "", "`URL` to GET; healthy when it answers 200 (e.g. http://127.0.0.1:9102/healthz)")
	grpcAddr := fs.String("grpc", "", "`host:port` of a grpc.health.v1 server; healthy when it answers SERVING (e.g. 127.0.0.1:8001)")
	grpcService := fs.String("grpc-service", "", "gRPC health `service` name to ask about; empty means the server as a whole")
	timeout := fs.Duration("timeout", defaultHealthTimeout, "give up after this `duration`")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *httpURL == "" && *grpcAddr == "" {
		return usagef("give --http URL or --grpc host:port (or both)")
	}
	if *timeout <= 0 {
		return usagef("-timeout is %v; want a positive duration", *timeout)
	}
	if *httpURL != "" && !strings.HasPrefix(*httpURL, "http://") && !strings.HasPrefix(*httpURL, "https://") {
		return usagef("-http %q: want an http:// or https:// URL", *httpURL)
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if *httpURL != "" {
		if err := checkHTTP(ctx, *httpURL); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "healthy: %s\n", *httpURL)
	}
	if *grpcAddr != "" {
		if err := checkGRPC(ctx, *grpcAddr, *grpcService); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "healthy: grpc %s\n", *grpcAddr)
	}
	return nil
}

// checkHTTP GETs url and wants 200. Any other answer is an error that
// quotes the start of the body, where a service says why it is unhealthy.
func checkHTTP(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("unhealthy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		if msg != "" {
			msg = ": " + msg
		}
		return fmt.Errorf("unhealthy: %s answered %s%s", url, resp.Status, msg)
	}
	return nil
}

// checkGRPC asks addr's grpc.health.v1 service about service and wants
// SERVING. The connection is plaintext, as recmesh serves it.
func checkGRPC(ctx context.Context, addr, service string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("grpc %s: %w", addr, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("unhealthy: grpc %s: no answer in time: %w", addr, err)
		}
		return fmt.Errorf("unhealthy: grpc %s: %w", addr, err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("unhealthy: grpc %s service %q is %s", addr, service, st)
	}
	return nil
}
