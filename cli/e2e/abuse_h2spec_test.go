package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/summerwind/h2spec/config"
	"github.com/summerwind/h2spec/generic"
	h2spechpack "github.com/summerwind/h2spec/hpack"
	h2spechttp2 "github.com/summerwind/h2spec/http2"
	"github.com/summerwind/h2spec/spec"

	pb "github.com/recmesh/recmesh/proto/inference"
)

// h2specNeedsNonGRPC are the h2spec cases a gRPC server cannot pass, by
// case id ("spec/section/sequence"), each with its reason: the same list
// frontend/h2unary's TestH2spec keeps. h2spec's requests are GETs, or
// POSTs without a gRPC content type; a gRPC server answers one at its
// headers with an HTTP status in a trailers-only response and closes the
// stream. Every other case must pass; the run counts the ones that do not
// as h2spec_lean_failed, and fails unless that is 0.
var h2specNeedsNonGRPC = map[string]string{
	"generic/2/2":     "waits for DATA in the answer to a GET, which gRPC answers 405 with trailers only",
	"generic/2/3":     "as generic/2/2",
	"http2/4.2/3":     "assumes the default SETTINGS_MAX_FRAME_SIZE: lean advertises 1 MiB, so its 20 KB HEADERS frame is legal (and refused 431 for its header list)",
	"http2/5.1.2/1":   "wants streams left open past SETTINGS_MAX_CONCURRENT_STREAMS: each GET is answered 405 and closed as it arrives",
	"http2/6.9.1/3":   "wants the GET's stream left open for its WINDOW_UPDATEs: it was answered 405 and closed at its headers",
	"http2/8.1.2.6/1": "the POST without a gRPC content type is refused 415 at its headers, before the DATA whose length content-length misstates",
	"http2/8.1.2.6/2": "as http2/8.1.2.6/1, with two DATA frames",
}

// h2spec runs the h2spec conformance suite (the generic, http2 and hpack
// specs, as the h2spec command does) against f, the lean transport's
// port of the real mesh, calling ServerReady, and records how many cases
// failed outside h2specNeedsNonGRPC.
func (a *abuseRun) h2spec(t *testing.T, f *abuseFrontend) (string, error) {
	c := &config.Config{
		Host: "127.0.0.1", Port: f.port,
		Path: pb.GRPCInferenceService_ServerReady_FullMethodName,
		// A passing case gets its frame at once; the timeout is what a
		// failing one costs.
		Timeout:      2 * time.Second,
		MaxHeaderLen: 4000,
	}
	// h2spec reports on stdout as it goes: into a file, shown on failure.
	logPath := filepath.Join(t.TempDir(), "h2spec.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", fmt.Errorf("h2spec log: %w", err)
	}
	groups := []*spec.TestGroup{generic.Spec(), h2spechttp2.Spec(), h2spechpack.Spec()}
	stdout := os.Stdout
	os.Stdout = logFile
	func() {
		defer func() { os.Stdout = stdout; logFile.Close() }()
		for _, g := range groups {
			g.Test(c)
		}
	}()

	var passed, failed, excluded, skipped []string
	var walk func(g *spec.TestGroup)
	walk = func(g *spec.TestGroup) {
		for _, tc := range append(g.Tests, g.StrictTests...) {
			r := tc.Result
			if r == nil {
				continue
			}
			id := fmt.Sprintf("%s/%d", g.ID(), r.Sequence)
			switch {
			case r.Skipped:
				skipped = append(skipped, id)
			case !r.Failed:
				passed = append(passed, id)
				if why, ok := h2specNeedsNonGRPC[id]; ok {
					t.Logf("h2spec %s (%s) passes now: take it off h2specNeedsNonGRPC (%s)", id, tc.Desc, why)
				}
			case h2specNeedsNonGRPC[id] != "":
				excluded = append(excluded, id)
			default:
				msg := "no error"
				if r.Error != nil {
					msg = strings.ReplaceAll(r.Error.Error(), "\n", "; ")
				}
				failed = append(failed, fmt.Sprintf("%s %s: %s", id, tc.Desc, msg))
			}
		}
		for _, sub := range g.Groups {
			walk(sub)
		}
	}
	for _, g := range groups {
		walk(g)
	}
	sort.Strings(failed)
	for _, f := range failed {
		t.Logf("h2spec failed: %s", f)
	}
	if len(passed) == 0 {
		b, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("no h2spec case passed; is %s speaking HTTP/2? h2spec said:\n%s", f.addr(), tail(string(b)))
	}
	a.mu.Lock()
	a.h2specFailed = len(failed)
	a.mu.Unlock()
	return fmt.Sprintf("h2spec_passed=%d h2spec_failed=%d h2spec_excluded=%d h2spec_skipped=%d",
		len(passed), len(failed), len(excluded), len(skipped)), nil
}
