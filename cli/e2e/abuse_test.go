package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// abuseEnv gates TestE2EAbuse: make e2e-abuse sets it, so a plain go test
// of the package skips the run (minutes, and CPU hogs beside it).
const abuseEnv = "RECMESH_E2E_ABUSE"

// The attacks, by the names the log lines, RECMESH_ABUSE_ATTACKS and the
// subtests (-run 'TestE2EAbuse/lean/hpack_bomb') use.
const (
	atkHog        = "cpu_hog"
	atkHostile    = "hostile_frontend"
	atkStorm      = "deadline_storm"
	atkReset      = "rapid_reset"
	atkBomb       = "hpack_bomb"
	atkCont       = "continuation_flood"
	atkUnfinished = "unfinished_bodies"
	atkDribble    = "dribble"
	atkPrefix     = "huge_prefix"
	atkH2spec     = "h2spec"
)

// transportAttacks run against each transport's frontend, in this order;
// h2spec runs against the lean one only.
var transportAttacks = []string{atkStorm, atkReset, atkBomb, atkCont, atkUnfinished, atkDribble, atkPrefix}

var abuseTransports = []string{"grpc", "lean"}

// abuseFrontend is one frontend of the mesh, alone on its port, so an
// attack and the recovery probe reach exactly it.
type abuseFrontend struct {
	transport, name string
	port            int
}

func (f *abuseFrontend) addr() string { return "127.0.0.1:" + strconv.Itoa(f.port) }

func (f *abuseFrontend) args() []string {
	return []string{"--port", strconv.Itoa(f.port), "--transport", f.transport}
}

// attackFunc runs one attack, against f (nil for the mesh-wide ones), and
// returns what it saw of the server, for the log line. An error means the
// attack itself could not be carried out.
type attackFunc func(t *testing.T, f *abuseFrontend) (detail string, err error)

// abuseRun is make e2e-abuse's state: the mesh, the honest clients, and
// the results that make up the summary line.
type abuseRun struct {
	c      *cluster
	w      *workload
	all    []*abuseFrontend // one per transport
	fronts []*abuseFrontend // the ones attacked (RECMESH_ABUSE_TRANSPORTS)
	honest *honestLoad

	recoverBound time.Duration
	rssLimitMiB  float64
	only         map[string]bool // RECMESH_ABUSE_ATTACKS; nil: all
	transports   []string

	mu            sync.Mutex
	attacks       int
	maxRSS        float64
	wedged        int
	h2specFailed  int // -1: not run
	accelSpoof    string
	laneHoard     string
	falseRestarts int
	hogRan        bool
	hogUnavail    int64
}

// TestE2EAbuse is make e2e-abuse: a real mesh with one frontend per
// transport (grpc-go and the lean one), honest clients calling both
// throughout with every score checked against the reference, and one
// attack after another: a CPU hog beside the mesh, a hostile frontend on
// the shared-memory broker, then per transport a deadline and
// cancellation storm, rapid reset, an HPACK bomb, a CONTINUATION flood,
// unfinished bodies, dribbling connections and huge length prefixes, and
// h2spec on the lean transport. After each, every frontend must serve
// correct scores again within RECMESH_ABUSE_RECOVER_SECONDS (10; one that
// does not is wedged, counted and restarted) and no frontend's RSS may
// pass 256 MiB. It ends with the `abuse ok:` line, or, when attacks were
// left out (RECMESH_ABUSE_ATTACKS, RECMESH_ABUSE_TRANSPORTS, -run), an
// `abuse partial:` one.
func TestE2EAbuse(t *testing.T) {
	if os.Getenv(abuseEnv) == "" {
		t.Skip("make e2e-abuse runs this (RECMESH_E2E_ABUSE=1)")
	}
	a := startAbuseMesh(t)
	defer a.honest.stop()

	a.attack(t, atkHog, nil, a.cpuHog)
	a.attack(t, atkHostile, nil, a.hostileFrontend)
	attacks := map[string]attackFunc{
		atkStorm: a.deadlineStorm, atkReset: a.rapidReset, atkBomb: a.hpackBomb, atkCont: a.continuationFlood,
		atkUnfinished: a.unfinishedBodies, atkDribble: a.dribble, atkPrefix: a.hugePrefixes,
	}
	for _, f := range a.fronts {
		t.Run(f.transport, func(t *testing.T) {
			for _, name := range transportAttacks {
				a.attack(t, name, f, attacks[name])
			}
			if f.transport == "lean" {
				a.attack(t, atkH2spec, f, a.h2spec)
			}
		})
	}
	a.honest.stop()
	a.summary(t)
}

// startAbuseMesh starts NATS, the embedder, the accelerator and one
// frontend per transport, and the honest clients.
func startAbuseMesh(t *testing.T) *abuseRun {
	a := &abuseRun{
		w:            loadWorkload(t),
		recoverBound: time.Duration(envInt("RECMESH_ABUSE_RECOVER_SECONDS", 10)) * time.Second,
		rssLimitMiB:  float64(envInt("RECMESH_ABUSE_RSS_LIMIT_MIB", 256)),
		transports:   abuseTransports,
		h2specFailed: -1,
		accelSpoof:   "not_run",
		laneHoard:    "not_run",
	}
	if v := os.Getenv("RECMESH_ABUSE_ATTACKS"); v != "" {
		a.only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			a.only[strings.TrimSpace(s)] = true
		}
	}
	if v := os.Getenv("RECMESH_ABUSE_TRANSPORTS"); v != "" {
		a.transports = strings.Split(v, ",")
	}
	natsPort := freePort(t)
	startNATSAt(t, natsPort)
	a.c = newCluster(t, "model")
	a.c.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	a.c.start("embedder")
	a.c.start("accelerator")
	for i, tr := range abuseTransports {
		f := &abuseFrontend{transport: tr, name: "frontend-" + tr, port: a.c.port}
		if i > 0 {
			f.port = freePort(t)
		}
		a.c.start(f.name, f.args()...)
		a.all = append(a.all, f)
		if slices.Contains(a.transports, tr) {
			a.fronts = append(a.fronts, f)
		}
	}
	began := time.Now()
	a.c.waitServing(3 * time.Minute)
	t.Logf("mesh serving after %v: frontends %s", time.Since(began).Round(time.Millisecond), a.describeFronts())
	a.honest = startHonest(t, a.w, a.allFronts())
	waitFor(t, time.Minute, "honest calls succeeding on every frontend", a.honest.allServing)
	return a
}

// allFronts is every frontend of the mesh, attacked or not: the honest
// clients call them all, and each must recover after every attack.
func (a *abuseRun) allFronts() []*abuseFrontend { return a.all }

func (a *abuseRun) describeFronts() string {
	var s []string
	for _, f := range a.allFronts() {
		s = append(s, fmt.Sprintf("%s=%s(pid %d)", f.transport, f.addr(), a.pid(f.name)))
	}
	return strings.Join(s, " ")
}

func (a *abuseRun) pid(name string) int {
	if p, ok := a.c.procs[name]; ok {
		return p.cmd.Process.Pid
	}
	return 0
}

func (a *abuseRun) selected(name string) bool { return a.only == nil || a.only[name] }

// attack runs fn as the subtest name (per transport when f is set), with
// every frontend's RSS sampled, then waits for every frontend to serve
// correct scores again, restarts the ones that do not (wedged) and any
// mesh process that died, and logs the attack's line.
func (a *abuseRun) attack(t *testing.T, name string, f *abuseFrontend, fn attackFunc) {
	if !a.selected(name) {
		return
	}
	t.Run(name, func(t *testing.T) {
		a.mu.Lock()
		a.attacks++
		a.mu.Unlock()
		fronts := a.allFronts()
		before := a.honest.snapshot()
		rss := startRSSSampler(a.c, fronts)
		began := time.Now()
		detail, err := fn(t, f)
		if err != nil {
			t.Errorf("attack %s could not be carried out: %v", name, err)
		}
		took := time.Since(began)
		rec := a.recoverAll(fronts)
		peak := rss.stop()
		after := a.honest.snapshot()

		transport, recovered := "mesh", time.Duration(0)
		targetRSS, startRSS, allRSS := 0.0, 0.0, 0.0
		wedged := 0
		for _, fr := range fronts {
			r := rec[fr.name]
			if _, ok := peak[fr.name]; !ok {
				// Mesh processes are not dumpable: their /proc files
				// belong to root, and an unread RSS must not pass.
				t.Errorf("attack %s: could not read frontend %s's VmRSS (run as root)", name, fr.transport)
			}
			if f == nil || f.name == fr.name {
				recovered = max(recovered, r.took)
				targetRSS = max(targetRSS, peak[fr.name])
				startRSS = max(startRSS, rss.first[fr.name])
			}
			allRSS = max(allRSS, peak[fr.name])
			switch {
			case r.err != nil:
				wedged++
				t.Errorf("attack %s: frontend %s wedged: %v", name, fr.transport, r.err)
				a.restartFrontend(t, fr, "wedged")
			case peak[fr.name] > a.rssLimitMiB:
				t.Errorf("attack %s: frontend %s's RSS reached %.0f MiB, over %.0f MiB (from %.0f MiB when the attack began)",
					name, fr.transport, peak[fr.name], a.rssLimitMiB, rss.first[fr.name])
				// Go keeps freed heap for a while: without a restart,
				// every later attack would report this one's peak.
				a.restartFrontend(t, fr, "over the RSS limit; restarted so the next attack starts from a clean baseline")
			}
		}
		a.healCore(t, name)
		if f != nil {
			transport = f.transport
		}
		a.mu.Lock()
		a.wedged += wedged
		a.maxRSS = max(a.maxRSS, allRSS)
		a.mu.Unlock()
		d := after.minus(before)
		target, other := d.split(f)
		recMs := strconv.FormatInt(recovered.Milliseconds(), 10)
		if wedged > 0 {
			recMs = "wedged"
		}
		// began is UTC, as the mesh processes stamp their logs, so a
		// failure can be matched with what they said meanwhile.
		t.Logf("abuse: transport=%s attack=%s rss_mib=%.0f recovered_ms=%s honest_calls=%d honest_failed=%d honest_wrong=%d other_failed=%d took_ms=%d began=%s rss_start_mib=%.0f %s %s",
			transport, name, targetRSS, recMs, target.calls, target.failed, target.wrong+other.wrong, other.failed, took.Milliseconds(),
			began.UTC().Format("15:04:05.000"), startRSS, formatRSS(peak), detail)
		if codes := d.codes(); codes != "" {
			t.Logf("abuse: attack=%s transport=%s honest failures by code: %s", name, transport, codes)
		}
	})
}

// recovery is how long after an attack a frontend first served a
// correct score; err when it did not within the bound.
type recovery struct {
	took time.Duration
	err  error
}

// recoverAll probes every frontend at once until each answers a call with
// the reference's scores, for at most a.recoverBound.
func (a *abuseRun) recoverAll(fronts []*abuseFrontend) map[string]recovery {
	out := map[string]recovery{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, f := range fronts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := probeUntil(f.addr(), a.w, start.Add(a.recoverBound), &a.honest.extraWrong)
			mu.Lock()
			out[f.name] = recovery{took: time.Since(start), err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// restartFrontend replaces a wedged, dead or bloated frontend, so the
// attacks after it measure a frontend that serves, from its usual size.
func (a *abuseRun) restartFrontend(t *testing.T, f *abuseFrontend, why string) {
	if p, ok := a.c.procs[f.name]; ok {
		select {
		case <-p.done:
			t.Logf("frontend %s had exited:\n%s", f.transport, tail(p.out.String()))
			delete(a.c.procs, f.name)
		default:
			if why == "wedged" {
				t.Logf("frontend %s output before its restart:\n%s", f.transport, tail(p.out.String()))
			}
			a.c.kill(f.name, syscall.SIGKILL)
		}
	}
	a.c.start(f.name, f.args()...)
	if err := probeUntil(f.addr(), a.w, time.Now().Add(2*time.Minute), &a.honest.extraWrong); err != nil {
		t.Fatalf("frontend %s does not serve after its restart: %v", f.transport, err)
	}
	t.Logf("frontend %s restarted (pid %d): %s", f.transport, a.pid(f.name), why)
}

// healCore restarts the embedder or the accelerator if an attack killed
// it: no client or frontend may be able to.
func (a *abuseRun) healCore(t *testing.T, attack string) {
	for _, name := range []string{"embedder", "accelerator"} {
		p := a.c.procs[name]
		select {
		case <-p.done:
		default:
			continue
		}
		t.Errorf("attack %s: the %s exited:\n%s", attack, name, tail(p.out.String()))
		delete(a.c.procs, name)
		a.c.start(name)
		for _, f := range a.allFronts() {
			if err := probeUntil(f.addr(), a.w, time.Now().Add(2*time.Minute), &a.honest.extraWrong); err != nil {
				t.Fatalf("the mesh does not serve after restarting the %s: %v", name, err)
			}
		}
	}
}

// summary checks the run's results and prints the last line.
func (a *abuseRun) summary(t *testing.T) {
	a.mu.Lock()
	defer a.mu.Unlock()
	wrong := a.honest.wrongTotal()
	h2 := "not_run"
	if a.h2specFailed >= 0 {
		h2 = strconv.Itoa(a.h2specFailed)
	}
	fr := "not_run"
	if a.hogRan {
		fr = strconv.Itoa(a.falseRestarts)
	}
	fields := fmt.Sprintf("transports=%s attacks=%d honest_wrong=%d wedged_frontends=%d max_frontend_rss_mib=%.0f h2spec_lean_failed=%s accel_spoof=%s lane_hoard=%s false_restarts=%s",
		strings.Join(a.transports, ","), a.attacks, wrong, a.wedged, a.maxRSS, h2, a.accelSpoof, a.laneHoard, fr)
	var failed []string
	check := func(ok bool, what string) {
		if !ok {
			failed = append(failed, what)
		}
	}
	check(wrong == 0, "honest_wrong")
	check(a.wedged == 0, "wedged_frontends")
	check(a.maxRSS <= a.rssLimitMiB, "max_frontend_rss_mib")
	check(a.accelSpoof == "refused" || a.accelSpoof == "not_run", "accel_spoof")
	check(a.laneHoard == "capped" || a.laneHoard == "not_run", "lane_hoard")
	check(a.falseRestarts == 0, "false_restarts")
	check(a.hogUnavail == 0, "hog_unavailable")
	check(a.h2specFailed <= 0, "h2spec_lean_failed")
	if len(failed) > 0 || t.Failed() {
		t.Errorf("abuse failed checks: %s", strings.Join(failed, ","))
		t.Logf("abuse not ok: %s failed_checks=%s", fields, strings.Join(failed, ","))
		return
	}
	full := len(a.transports) == len(abuseTransports) && a.attacks == 3+len(abuseTransports)*len(transportAttacks)
	if !full {
		fmt.Println("abuse partial: " + fields)
		return
	}
	fmt.Println("abuse ok: " + fields)
}

// envInt is the integer in environment variable name, def when unset or
// not a positive number.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
