package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

// The compose services the deployment is made of.
var composeServices = []string{"nats", "bundle", "mesh", "embedder", "accelerator", "frontend", "jaeger", "prometheus", "grafana"}

// meshService holds the namespaces the mesh processes share (recmesh
// pause), so that any of them can be restarted into the same ones.
const meshService = "mesh"

// Segment geometry (see shm): each lane has a 32 MiB arena, and there are
// two staging buffers of about 57 MiB.
const (
	laneArenaBytes   = 32 << 20
	stagingBuffers   = 2
	stagingBytes     = 57 << 20
	defaultLaneCount = 16
)

// segmentBytes is the shared-memory segment's size for lanes lanes.
func segmentBytes(lanes int) int64 {
	return int64(lanes)*laneArenaBytes + stagingBuffers*stagingBytes
}

func env(s types.ServiceConfig, name string) string {
	if v, ok := s.Environment[name]; ok && v != nil {
		return *v
	}
	return ""
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	for _, name := range composeServices {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("compose.yaml has no service %q", name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	fe := p.Services["frontend"]
	if fe.ContainerName != "" {
		t.Errorf("frontend has container_name %q: --scale frontend=N needs none", fe.ContainerName)
	}
	if len(fe.Ports) != 0 {
		t.Errorf("frontend publishes ports %v: replicas share the mesh service's published port", fe.Ports)
	}
	// Every mesh process joins the namespaces of the holder, none of
	// another process: a restarted embedder must come back into the same
	// IPC (segment), pid (liveness) and network (port) namespaces.
	for what, got := range map[string]string{"ipc": fe.Ipc, "network_mode": fe.NetworkMode, "pid": fe.Pid} {
		if got != "service:"+meshService {
			t.Errorf("frontend %s is %q; want service:%s", what, got, meshService)
		}
	}
	for _, name := range []string{"accelerator", "embedder"} {
		if s := p.Services[name]; s.Ipc != "service:"+meshService || s.Pid != "service:"+meshService {
			t.Errorf("%s ipc %q pid %q; want both service:%s", name, s.Ipc, s.Pid, meshService)
		}
	}

	mesh := p.Services[meshService]
	if cmd := strings.Join(mesh.Command, " "); cmd != "pause" || len(mesh.Entrypoint) != 1 || !strings.HasSuffix(mesh.Entrypoint[0], "/recmesh") {
		t.Errorf("mesh runs %v %v; want recmesh pause", mesh.Entrypoint, mesh.Command)
	}
	if mesh.Ipc != "shareable" {
		t.Errorf("mesh ipc is %q; want shareable", mesh.Ipc)
	}
	emb := p.Services["embedder"]
	lanes := defaultLaneCount
	if v := env(emb, "RECMESH_LANES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("embedder RECMESH_LANES=%q: %v", v, err)
		}
		lanes = n
	}
	// The embedder reserves each generation whole, and a rollout holds two.
	if need := 2 * segmentBytes(lanes); int64(mesh.ShmSize) < need {
		t.Errorf("mesh shm_size %d bytes is less than two %d-lane segments' %d (a rollout)", mesh.ShmSize, lanes, need)
	}
	// The frontends listen in the mesh service's network namespace, so it
	// publishes their port.
	fePort, err := strconv.Atoi(env(fe, "RECMESH_PORT"))
	if err != nil {
		t.Fatalf("frontend RECMESH_PORT: %v", err)
	}
	published := false
	for _, port := range mesh.Ports {
		published = published || port.Target == uint32(fePort)
	}
	if !published {
		t.Errorf("mesh publishes %v; want the frontends' port %d", mesh.Ports, fePort)
	}

	// Every process reads the same bundle, which the bundle service writes.
	bundle := p.Services["bundle"]
	out := env(emb, "RECMESH_BUNDLE")
	cmd := strings.Join(append(append([]string{}, bundle.Entrypoint...), bundle.Command...), " ")
	for _, want := range []string{"test -f " + out + "/model.safetensors", "recmesh export", "--out " + out} {
		if !strings.Contains(cmd, want) {
			t.Errorf("bundle service runs %q; want it to contain %q", cmd, want)
		}
	}
	for _, name := range []string{"bundle", "embedder", "accelerator", "frontend"} {
		s := p.Services[name]
		if got := env(s, "RECMESH_BUNDLE"); name != "bundle" && got != out {
			t.Errorf("%s RECMESH_BUNDLE=%q; want %q as the embedder", name, got, out)
		}
		mounted := false
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeVolume && v.Source == "bundle" && strings.HasPrefix(out+"/", v.Target+"/") {
				mounted = true
				if name == "bundle" && v.ReadOnly {
					t.Errorf("bundle service mounts the bundle volume read-only; it writes it")
				}
			}
		}
		if !mounted {
			t.Errorf("%s does not mount the bundle volume over %s", name, out)
		}
	}
}

// TestComposeReadiness: every service has a health check, or is a one-shot
// job that others wait for with service_completed_successfully; every
// dependency waits for a condition the dependency can meet.
func TestComposeReadiness(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	awaitedDone := map[string]bool{}
	for name, s := range p.Services {
		for dep, d := range s.DependsOn {
			target, ok := p.Services[dep]
			if !ok {
				t.Errorf("%s depends on unknown service %s", name, dep)
				continue
			}
			switch d.Condition {
			case types.ServiceConditionStarted:
				// Joining a service's namespaces (network_mode, ipc, pid:
				// service:X) waits for it to run, which is all the
				// namespace holder does.
				if dep != meshService {
					t.Errorf("%s depends on %s with condition %q; want service_healthy or service_completed_successfully", name, dep, d.Condition)
				}
			case types.ServiceConditionHealthy:
				if !hasHealthcheck(target) {
					t.Errorf("%s waits for %s to be healthy, which has no health check", name, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
				if target.Restart != "" && target.Restart != "no" {
					t.Errorf("%s waits for %s to complete, which restarts (%s)", name, dep, target.Restart)
				}
				awaitedDone[dep] = true
			default:
				t.Errorf("%s depends on %s with condition %q; want service_healthy or service_completed_successfully", name, dep, d.Condition)
			}
		}
	}
	for name, s := range p.Services {
		if !hasHealthcheck(s) && !awaitedDone[name] && name != meshService {
			t.Errorf("%s has no health check and no service waits for it to complete", name)
		}
	}
	// The serving chain starts in order: bundle and NATS, the embedder,
	// the accelerator, the frontends.
	for svc, deps := range map[string]map[string]string{
		"embedder":    {"bundle": types.ServiceConditionCompletedSuccessfully, "nats": types.ServiceConditionHealthy},
		"accelerator": {"embedder": types.ServiceConditionHealthy},
		"frontend":    {"embedder": types.ServiceConditionHealthy, "accelerator": types.ServiceConditionHealthy},
		"grafana":     {"prometheus": types.ServiceConditionHealthy, "jaeger": types.ServiceConditionHealthy},
	} {
		for dep, cond := range deps {
			if got := p.Services[svc].DependsOn[dep].Condition; got != cond {
				t.Errorf("%s depends on %s with %q; want %q", svc, dep, got, cond)
			}
		}
	}
}

func hasHealthcheck(s types.ServiceConfig) bool {
	h := s.HealthCheck
	return h != nil && !h.Disable && len(h.Test) > 0 && h.Test[0] != "NONE"
}

// processServices are the compose services that run a recmesh process
// serving /metrics, keyed by process.
func processServices(t *testing.T, p *types.Project) map[string]types.ServiceConfig {
	t.Helper()
	out := map[string]types.ServiceConfig{}
	for _, proc := range Processes {
		s, ok := p.Services[proc]
		if !ok {
			t.Fatalf("no compose service for process %s", proc)
		}
		out[proc] = s
	}
	return out
}

// metricsPorts parses a RECMESH_METRICS_ADDR: ":9102", or a range
// ":9110-9125" of which a process binds the first free port.
func metricsPorts(addr string) ([]int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	lo, hi, isRange := strings.Cut(port, "-")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return nil, err
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(hi); err != nil {
			return nil, err
		}
	}
	if b < a {
		return nil, fmt.Errorf("empty port range %s", port)
	}
	var ports []int
	for i := a; i <= b; i++ {
		ports = append(ports, i)
	}
	return ports, nil
}

// networkHost is the name under which the other services reach s: its own
// service name, or that of the service whose network namespace it joins.
func networkHost(name string, s types.ServiceConfig) string {
	if rest, ok := strings.CutPrefix(s.NetworkMode, types.NetworkModeServicePrefix); ok {
		return rest
	}
	return name
}

// TestComposeHealthchecks: each recmesh process is checked with `recmesh
// health` on the address it serves (/readyz on its metrics port: compose
// gates the next service on it; or the frontend's gRPC health service).
func TestComposeHealthchecks(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	for proc, s := range processServices(t, p) {
		test := strings.Join(s.HealthCheck.Test, " ")
		if !strings.Contains(test, "/usr/local/bin/recmesh health") {
			t.Errorf("%s health check %q: want /usr/local/bin/recmesh health", proc, test)
			continue
		}
		var want string
		if proc == Frontend {
			want = "--grpc 127.0.0.1:" + env(s, "RECMESH_PORT")
		} else {
			ports, err := metricsPorts(env(s, "RECMESH_METRICS_ADDR"))
			if err != nil || len(ports) != 1 {
				t.Errorf("%s RECMESH_METRICS_ADDR=%q: want one port (%v)", proc, env(s, "RECMESH_METRICS_ADDR"), err)
				continue
			}
			want = fmt.Sprintf("--http http://127.0.0.1:%d/readyz", ports[0])
		}
		if !strings.Contains(test, want) {
			t.Errorf("%s health check %q: want %q", proc, test, want)
		}
	}
}

// prometheusConfig is the part of prometheus.yml the tests read.
type prometheusConfig struct {
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

// hostFile maps a path inside service s's container to the host file that
// a bind mount puts there.
func hostFile(t *testing.T, s types.ServiceConfig, inside string) string {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if inside == v.Target {
			return v.Source
		}
		if rest, ok := strings.CutPrefix(inside, v.Target+"/"); ok {
			return filepath.Join(v.Source, filepath.FromSlash(rest))
		}
	}
	t.Fatalf("service %s mounts nothing over %s", s.Name, inside)
	return ""
}

// TestComposePrometheusTargets: Prometheus scrapes every port of every
// recmesh process, at the address compose gives it.
func TestComposePrometheusTargets(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	prom := p.Services["prometheus"]
	cfgPath := "/etc/prometheus/prometheus.yml"
	for _, arg := range prom.Command {
		if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
			cfgPath = v
		}
	}
	data, err := os.ReadFile(hostFile(t, prom, cfgPath))
	if err != nil {
		t.Fatal(err)
	}
	var cfg prometheusConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	jobOf := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				jobOf[target] = sc.JobName
			}
		}
	}
	for proc, s := range processServices(t, p) {
		ports, err := metricsPorts(env(s, "RECMESH_METRICS_ADDR"))
		if err != nil {
			t.Errorf("%s RECMESH_METRICS_ADDR=%q: %v", proc, env(s, "RECMESH_METRICS_ADDR"), err)
			continue
		}
		host := networkHost(proc, s)
		for _, port := range ports {
			target := net.JoinHostPort(host, strconv.Itoa(port))
			job, ok := jobOf[target]
			switch {
			case !ok:
				t.Errorf("prometheus.yml does not scrape %s (process %s)", target, proc)
			case job != proc:
				t.Errorf("prometheus.yml scrapes %s (process %s) as job %q; want job %q, which the dashboard groups by", target, proc, job, proc)
			}
		}
	}
}

// TestComposeImages: every image builds from files that exist, under the
// build arguments compose passes; services that share an image tag share
// its build.
func TestComposeImages(t *testing.T) {
	for _, files := range [][]string{{"compose.yaml"}, {"compose.yaml", "deploy/compose.cuda.yaml"}, {"compose.yaml", "deploy/compose.ebpf.yaml"}} {
		p := loadCompose(t, nil, files...)
		checkComposeImages(t, p)
	}
}

func checkComposeImages(t *testing.T, p *types.Project) {
	t.Helper()
	bc := newBuildContext(t, repoRoot(t))
	builds := map[string]string{}
	for name, s := range p.Services {
		if s.Build == nil {
			continue
		}
		if s.Image == "" {
			t.Errorf("%s builds an image but names no image tag", name)
		}
		if filepath.Clean(s.Build.Context) != filepath.Clean(bc.root) {
			t.Errorf("%s build context %s; want the repository root", name, s.Build.Context)
		}
		file := filepath.Join(s.Build.Context, s.Build.Dockerfile)
		if _, err := os.Stat(file); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		rel, _ := filepath.Rel(bc.root, file)
		idx := slices.IndexFunc(dockerfiles, func(d struct {
			file     string
			argSets  []map[string]string
			binaries []string
		}) bool {
			return d.file == filepath.ToSlash(rel)
		})
		if idx < 0 {
			t.Errorf("%s builds %s, which TestDockerfiles does not know", name, rel)
			continue
		}
		args := map[string]string{}
		for k, v := range s.Build.Args {
			if v != nil {
				args[k] = *v
			}
		}
		d := parseDockerfile(t, file)
		for _, problem := range checkImage(bc, d, args, dockerfiles[idx].binaries) {
			t.Errorf("%s: %s", name, problem)
		}
		key := fmt.Sprintf("%s %v", rel, args)
		if prev, ok := builds[s.Image]; ok && prev != key {
			t.Errorf("image %s is built two ways: %s and %s", s.Image, prev, key)
		}
		builds[s.Image] = key
	}
}

// TestComposeCUDA: the CUDA override builds the accelerator with the CUDA
// plugin under its own tag and reserves a GPU for it.
func TestComposeCUDA(t *testing.T) {
	cpu := loadCompose(t, nil, "compose.yaml").Services["accelerator"]
	p := loadCompose(t, nil, "compose.yaml", "deploy/compose.cuda.yaml")
	acc := p.Services["accelerator"]
	if v := acc.Build.Args["PJRT"]; v == nil || *v != "cuda" {
		t.Errorf("accelerator build args %v; want PJRT=cuda", acc.Build.Args)
	}
	if acc.Image == cpu.Image {
		t.Errorf("the CUDA accelerator image has the CPU one's tag %s", acc.Image)
	}
	gpu := false
	if acc.Deploy != nil && acc.Deploy.Resources.Reservations != nil {
		for _, d := range acc.Deploy.Resources.Reservations.Devices {
			gpu = gpu || (d.Driver == "nvidia" && slices.Contains(d.Capabilities, "gpu"))
		}
	}
	if !gpu {
		t.Error("the CUDA override reserves no NVIDIA GPU for the accelerator")
	}
	// The override changes nothing else about how the mesh is wired.
	if acc.Ipc != cpu.Ipc || acc.Pid != cpu.Pid || !hasHealthcheck(acc) {
		t.Errorf("the CUDA override changed the accelerator's ipc/pid/health check")
	}
}

// TestComposeEBPF: the eBPF override gives the frontends eBPF steering,
// the one capability it needs and a directory of the host's bpffs of their
// own, which a one-shot service makes for their user before they start,
// and changes nothing else about how they are wired.
func TestComposeEBPF(t *testing.T) {
	plain := loadCompose(t, nil, "compose.yaml").Services["frontend"]
	p := loadCompose(t, nil, "compose.yaml", "deploy/compose.ebpf.yaml")
	fe := p.Services["frontend"]
	if v := env(plain, "RECMESH_STEERING"); v != "auto" {
		t.Errorf("compose.yaml frontend RECMESH_STEERING=%q; want auto (kernel-hash where eBPF cannot load)", v)
	}
	if v := env(fe, "RECMESH_STEERING"); v != "ebpf" {
		t.Errorf("eBPF override: RECMESH_STEERING=%q; want ebpf", v)
	}
	if !slices.Equal(fe.CapAdd, []string{"BPF"}) {
		t.Errorf("eBPF override: cap_add %v; want [BPF] only", fe.CapAdd)
	}
	const hostDir = "/sys/fs/bpf/recmesh"
	var bound string
	for _, v := range fe.Volumes {
		if v.Source == hostDir {
			bound = v.Target
		}
		if v.Source == "/sys/fs/bpf" {
			t.Errorf("eBPF override mounts the whole bpffs into the frontends: %+v", v)
		}
	}
	if bound == "" {
		t.Fatalf("eBPF override binds no %s into the frontends: %+v", hostDir, fe.Volumes)
	}
	if dir := env(fe, "RECMESH_STEERING_DIR"); dir != bound {
		t.Errorf("eBPF override: RECMESH_STEERING_DIR=%q, but the bpffs directory is bound at %q", dir, bound)
	}
	if fe.NetworkMode != plain.NetworkMode || fe.Ipc != plain.Ipc || fe.Pid != plain.Pid || fe.User != plain.User {
		t.Error("the eBPF override changed the frontend's user or its network, ipc or pid namespace")
	}
	for name := range plain.DependsOn {
		if _, ok := fe.DependsOn[name]; !ok {
			t.Errorf("eBPF override dropped the frontend's dependency on %s", name)
		}
	}
	if d, ok := fe.DependsOn[steeringDirService]; !ok || d.Condition != "service_completed_successfully" {
		t.Errorf("frontends do not wait for %s to complete: %+v", steeringDirService, fe.DependsOn)
	}

	// The one-shot makes the directory for the frontends' user, owner-only.
	sd := p.Services[steeringDirService]
	uid, _, _ := strings.Cut(fe.User, ":")
	script := strings.Join(sd.Command, " ")
	for _, want := range []string{"mkdir -p " + hostDir, "chown " + uid + ":" + uid + " " + hostDir, "chmod 0700 " + hostDir} {
		if !strings.Contains(script, want) {
			t.Errorf("%s command %q lacks %q", steeringDirService, script, want)
		}
	}
	hostBPF := false
	for _, v := range sd.Volumes {
		hostBPF = hostBPF || (v.Source == "/sys/fs/bpf" && v.Target == "/sys/fs/bpf")
	}
	if !hostBPF {
		t.Errorf("%s does not mount the host's bpffs: %+v", steeringDirService, sd.Volumes)
	}
	if sd.Restart != "no" {
		t.Errorf("%s restart %q; want no (a one-shot)", steeringDirService, sd.Restart)
	}
}

// steeringDirService is deploy/compose.ebpf.yaml's one-shot that makes the
// frontends' directory on the host's bpffs.
const steeringDirService = "steering-dir"

// hardenedServices are the compose services that run a recmesh binary.
var hardenedServices = []string{"bundle", "nats-identities", meshService, Embedder, Accelerator, Frontend}

// checkHardened: s runs with every capability dropped but those in capAdd,
// a read-only root file system and no-new-privileges.
func checkHardened(t *testing.T, where string, s types.ServiceConfig, capAdd ...string) {
	t.Helper()
	if !slices.ContainsFunc(s.CapDrop, func(c string) bool { return strings.EqualFold(c, "ALL") }) {
		t.Errorf("%s: cap_drop %v; want ALL", where, s.CapDrop)
	}
	got := slices.Clone(s.CapAdd)
	for i, c := range got {
		got[i] = strings.TrimPrefix(strings.ToUpper(c), "CAP_")
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(capAdd))
	if !slices.Equal(got, want) {
		t.Errorf("%s: cap_add %v; want %v", where, s.CapAdd, want)
	}
	if !s.ReadOnly {
		t.Errorf("%s: root file system not read_only", where)
	}
	if !slices.ContainsFunc(s.SecurityOpt, func(o string) bool {
		return o == "no-new-privileges" || o == "no-new-privileges:true" || o == "no-new-privileges=true"
	}) {
		t.Errorf("%s: security_opt %v; want no-new-privileges:true", where, s.SecurityOpt)
	}
	if s.Privileged {
		t.Errorf("%s: privileged", where)
	}
	// A read-only root needs somewhere to write scratch files.
	if !slices.ContainsFunc(s.Tmpfs, func(m string) bool { return m == "/tmp" || strings.HasPrefix(m, "/tmp:") }) {
		t.Errorf("%s: tmpfs %v; want a tmpfs on /tmp", where, s.Tmpfs)
	}
}

// TestComposeHardening: the recmesh containers are locked down; every port
// but the gRPC inference port is published on 127.0.0.1 only; Grafana
// admits no anonymous user; and the processes' /metrics, which bind
// loopback by default, are told to listen where Prometheus can reach them.
func TestComposeHardening(t *testing.T) {
	for _, files := range [][]string{{"compose.yaml"}, {"compose.yaml", "deploy/compose.cuda.yaml"}, {"compose.yaml", "deploy/compose.ebpf.yaml"}} {
		p := loadCompose(t, nil, files...)
		ebpf := slices.Contains(files, "deploy/compose.ebpf.yaml")
		hardened := hardenedServices
		if ebpf {
			hardened = append(slices.Clone(hardened), steeringDirService)
		}
		for _, name := range hardened {
			var add []string
			switch {
			case ebpf && name == Frontend:
				// eBPF steering: create the maps and load the program,
				// nothing more.
				add = []string{"BPF"}
			case name == steeringDirService:
				// Hand the frontends' bpffs directory to their user.
				add = []string{"CHOWN"}
			}
			checkHardened(t, fmt.Sprintf("%v %s", files, name), p.Services[name], add...)
		}
		for name, s := range p.Services {
			if !slices.Contains(hardened, name) && (len(s.CapAdd) != 0 || s.Privileged) {
				t.Errorf("%v %s: cap_add %v privileged %v", files, name, s.CapAdd, s.Privileged)
			}
		}

		fePort := env(p.Services[Frontend], "RECMESH_PORT")
		for name, s := range p.Services {
			for _, port := range s.Ports {
				inference := name == meshService && strconv.Itoa(int(port.Target)) == fePort
				if inference {
					continue // the service itself: published on every interface
				}
				if port.HostIP != "127.0.0.1" {
					t.Errorf("%v %s publishes port %d on %q; want 127.0.0.1 (observability stays on this host)", files, name, port.Target, port.HostIP)
				}
			}
		}
	}

	p := loadCompose(t, nil, "compose.yaml")
	// Only what the tests above expect is published at all.
	for name, want := range map[string]uint32{"prometheus": 9090, "grafana": 3000, "jaeger": 16686} {
		s := p.Services[name]
		if len(s.Ports) != 1 || s.Ports[0].Target != want || s.Ports[0].HostIP != "127.0.0.1" {
			t.Errorf("%s ports %+v; want %d on 127.0.0.1", name, s.Ports, want)
		}
	}
	for _, name := range []string{"nats", Embedder, Accelerator, Frontend, "bundle"} {
		if ports := p.Services[name].Ports; len(ports) != 0 {
			t.Errorf("%s publishes %+v; want nothing", name, ports)
		}
	}

	g := p.Services["grafana"]
	if v := env(g, "GF_AUTH_ANONYMOUS_ENABLED"); v != "false" {
		t.Errorf("grafana GF_AUTH_ANONYMOUS_ENABLED=%q; want \"false\"", v)
	}

	for proc, s := range processServices(t, p) {
		addr := env(s, "RECMESH_METRICS_ADDR")
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s RECMESH_METRICS_ADDR=%q: %v", proc, addr, err)
			continue
		}
		if host != "" && host != "0.0.0.0" && host != "::" {
			t.Errorf("%s RECMESH_METRICS_ADDR=%q: Prometheus scrapes from another container; want every interface (\":port\")", proc, addr)
		}
	}
}

// TestComposeFrontendsAsAnotherUser: the frontends face the clients, so
// compose runs them as another user than the embedder's, in its group,
// naming its uid; the embedder's socket admits that group
// (docs/security.md, "Frontends as another user").
func TestComposeFrontendsAsAnotherUser(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	fe, emb := p.Services[Frontend], p.Services[Embedder]
	if fe.User != "65533:65533" || !slices.Contains(fe.GroupAdd, "65532") {
		t.Errorf("frontend user %q group_add %v; want 65533:65533 with the group 65532", fe.User, fe.GroupAdd)
	}
	if v := env(fe, "RECMESH_SEGMENT_OWNER_UID"); v != "65532" {
		t.Errorf("frontend RECMESH_SEGMENT_OWNER_UID=%q; want the embedder's uid 65532", v)
	}
	if v := env(emb, "RECMESH_SEGMENT_MODE"); v != "0660" {
		t.Errorf("embedder RECMESH_SEGMENT_MODE=%q; want 0660 (the frontends' group)", v)
	}
	for _, name := range []string{Embedder, Accelerator} {
		if u := p.Services[name].User; u != "" {
			t.Errorf("%s user %q; want the image's 65532, which the frontends name", name, u)
		}
	}
}

// TestComposeNATSClosed: compose's NATS runs with the generated
// authorization, and each recmesh process holds its own role's seed and no
// other (a frontend container cannot read a key that may roll out).
func TestComposeNATSClosed(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	n := p.Services["nats"]
	if !slices.Contains(n.Command, "-c") || !slices.Contains(n.Command, "/nats/server/auth.conf") {
		t.Errorf("nats command %v; want -c /nats/server/auth.conf", n.Command)
	}
	if d, ok := n.DependsOn["nats-identities"]; !ok || d.Condition != "service_completed_successfully" {
		t.Errorf("nats depends_on %+v; want nats-identities completed", n.DependsOn)
	}
	gen := p.Services["nats-identities"]
	if !slices.Contains(gen.Command, "nats-identities") {
		t.Errorf("nats-identities command %v", gen.Command)
	}
	identityVolumes := func(s types.ServiceConfig) []string {
		var out []string
		for _, v := range s.Volumes {
			if strings.HasPrefix(v.Source, "nats-") {
				out = append(out, v.Source)
			}
		}
		slices.Sort(out)
		return out
	}
	for name, want := range map[string][]string{
		Embedder:    {"nats-admin", "nats-embedder"},
		Accelerator: {"nats-accelerator"},
		Frontend:    {"nats-frontend"},
		"nats":      {"nats-server"},
	} {
		s := p.Services[name]
		if got := identityVolumes(s); !slices.Equal(got, want) {
			t.Errorf("%s mounts identity volumes %v; want %v", name, got, want)
		}
		for _, v := range s.Volumes {
			if strings.HasPrefix(v.Source, "nats-") && !v.ReadOnly {
				t.Errorf("%s mounts %s read-write", name, v.Source)
			}
		}
		if name == "nats" {
			continue
		}
		role := strings.TrimPrefix(name, "recmesh-")
		if got, want := env(s, "NATS_NKEY"), "/nats/"+role+"/"+role+".nk"; got != want {
			t.Errorf("%s NATS_NKEY=%q; want %q", name, got, want)
		}
	}
}
