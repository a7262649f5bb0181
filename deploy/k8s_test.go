package deploy

import (
	"bytes"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	ktypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const k8sDir = "k8s"

// The kustomizations to render, and what sets each apart.
var k8sVariants = []struct {
	dir      string
	shm      string // the shm volume: Memory, HugePages-2Mi or hostPath
	gpu      bool
	frontend bool // a separate frontend Deployment
}{
	{"base", "Memory", false, false},
	{"overlays/hugepages", "HugePages-2Mi", false, false},
	{"overlays/cuda", "Memory", true, false},
	{"overlays/frontend-deployment", "hostPath", false, true},
	{"overlays/frontend-queue-hpa", "hostPath", false, true},
}

// strictDecoder decodes manifests into the Kubernetes API types, failing
// on unknown and duplicate fields, as kubectl --validate=strict does.
func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, autoscalingv2.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
}

// splitYAML splits a multi-document YAML stream.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), data...), []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(d []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(d, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func isKustomization(path string) bool {
	switch filepath.Base(path) {
	case "kustomization.yaml", "kustomization.yml", "Kustomization":
		return true
	}
	return false
}

// TestK8sManifestsStrict decodes every manifest and patch under k8s/
// strictly into the API types, and every kustomization strictly into
// kustomize's type.
func TestK8sManifestsStrict(t *testing.T) {
	dec := strictDecoder(t)
	n := 0
	err := filepath.WalkDir(k8sDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if isKustomization(path) {
			var k ktypes.Kustomization
			if err := yaml.UnmarshalStrict(data, &k); err != nil {
				t.Errorf("%s: %v", path, err)
			}
			return nil
		}
		for i, doc := range splitYAML(data) {
			n++
			if _, _, err := dec.Decode(doc, nil, nil); err != nil {
				t.Errorf("%s document %d: %v", path, i+1, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no manifests under k8s/")
	}
}

// TestK8sStrictDecoderCatches makes sure the decoder is strict.
func TestK8sStrictDecoderCatches(t *testing.T) {
	bad := []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  selectr: {a: b}\n")
	if _, _, err := strictDecoder(t).Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "selectr") {
		t.Errorf("a misspelt field decoded: %v", err)
	}
}

// rendered is one kustomize build, decoded.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	namespaces  map[string]*corev1.Namespace
}

// build renders dir with kustomize's Go API, as `kustomize build` does, and
// decodes the output strictly.
func build(t *testing.T, dir string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(filepath.Join(k8sDir, dir))
	if err != nil {
		t.Fatal(err)
	}
	m, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{},
		services:    map[string]*corev1.Service{},
		configMaps:  map[string]*corev1.ConfigMap{},
		namespaces:  map[string]*corev1.Namespace{},
	}
	dec := strictDecoder(t)
	for _, doc := range splitYAML(out) {
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("kustomize build %s: %v\n%s", dir, err, doc)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.deployments[o.Name] = o
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Namespace:
			r.namespaces[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			r.hpas = append(r.hpas, o)
		default:
			t.Errorf("kustomize build %s: unexpected %v", dir, gvk)
		}
		if ns := obj.(interface{ GetNamespace() string }).GetNamespace(); gvk.Kind != "Namespace" && ns != "recmesh" {
			t.Errorf("kustomize build %s: %s %v is in namespace %q; want recmesh", dir, gvk.Kind, obj, ns)
		}
	}
	return r
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// containerEnv resolves a container's variable from env and the
// ConfigMaps of envFrom.
func (r *rendered) containerEnv(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		if cm, ok := r.configMaps[ef.ConfigMapRef.Name]; ok {
			if v, ok := cm.Data[name]; ok {
				return v, true
			}
		}
	}
	return "", false
}

func TestK8sRender(t *testing.T) {
	for _, v := range k8sVariants {
		t.Run(strings.ReplaceAll(v.dir, "/", "_"), func(t *testing.T) {
			r := build(t, v.dir)
			checkWorkloads(t, r)
			checkServing(t, r, v.shm, v.gpu)
			checkRouting(t, r)
			if v.frontend {
				checkFrontendDeployment(t, r)
			} else if len(r.hpas) != 0 || r.deployments["recmesh-frontend"] != nil {
				t.Errorf("%s has a frontend Deployment or HPA; only the frontend-deployment overlay should", v.dir)
			}
		})
	}
}

// checkWorkloads: every container has probes and resources, every
// envFrom names a ConfigMap that exists, and every recmesh pod runs as
// non-root.
func checkWorkloads(t *testing.T, r *rendered) {
	for name, d := range r.deployments {
		spec := &d.Spec.Template.Spec
		sel, err := metaSelector(d.Spec.Selector.MatchLabels)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("deployment %s: selector %v does not match its pods %v", name, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		}
		if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("deployment %s: the pod does not set runAsNonRoot", name)
		}
		all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
		for i, c := range all {
			where := fmt.Sprintf("deployment %s container %s", name, c.Name)
			init := i < len(spec.InitContainers)
			req, lim := c.Resources.Requests, c.Resources.Limits
			if req.Cpu().IsZero() || req.Memory().IsZero() {
				t.Errorf("%s: want cpu and memory requests, have %v", where, req)
			}
			if lim.Memory().IsZero() {
				t.Errorf("%s: want a memory limit, have %v", where, lim)
			} else if lim.Memory().Cmp(*req.Memory()) < 0 {
				t.Errorf("%s: memory limit %v below its request %v", where, lim.Memory(), req.Memory())
			}
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil && r.configMaps[ef.ConfigMapRef.Name] == nil {
					t.Errorf("%s: envFrom ConfigMap %s does not exist", where, ef.ConfigMapRef.Name)
				}
			}
			// An image without a tag is :latest, which no one builds: the
			// kubelet would pull it (make k8s-test found one an overlay
			// added outside the base's images: transformer).
			if c.Image == "" {
				t.Errorf("%s: no image", where)
			} else if _, tag, ok := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":"); !ok || tag == "" || tag == "latest" {
				t.Errorf("%s: image %q has no tag (the kustomization's images: must cover it)", where, c.Image)
			}
			if init {
				continue
			}
			for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil {
					t.Errorf("%s: no %s probe", where, kind)
					continue
				}
				checkProbePort(t, where, kind, &c, p)
			}
			if c.StartupProbe != nil {
				checkProbePort(t, where, "startup", &c, c.StartupProbe)
			}
			// Liveness is the process's own progress, readiness whether it
			// can serve: an embedder restart must make its peers unready,
			// never get them restarted.
			if c.Name == Embedder || c.Name == Accelerator {
				for kind, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz", c.StartupProbe: "/readyz"} {
					if kind != nil && (kind.HTTPGet == nil || kind.HTTPGet.Path != want) {
						t.Errorf("%s: probe %+v; want HTTP GET %s", where, kind.ProbeHandler, want)
					}
				}
			}
			if slices.Contains(Processes, c.Name) {
				v, _ := r.containerEnv(&c, "RECMESH_METRICS_ADDR")
				checkMetricsReachable(t, where, v, &c)
			}
		}
	}
	// The NATS the configuration names is a Service here.
	for _, cm := range r.configMaps {
		if v, ok := cm.Data["NATS_URL"]; ok {
			u, err := url.Parse(v)
			if err != nil {
				t.Errorf("NATS_URL %q: %v", v, err)
				continue
			}
			svc := r.services[u.Hostname()]
			if svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == u.Port() }) {
				t.Errorf("NATS_URL %s: no Service %s with port %s", v, u.Hostname(), u.Port())
			}
		}
	}
}

// checkMetricsReachable: a recmesh process binds /metrics and /healthz to
// loopback unless RECMESH_METRICS_ADDR says otherwise, and the kubelet's
// probes and Prometheus come from outside the pod: the container must set
// it to every interface, on a port it declares.
func checkMetricsReachable(t *testing.T, where, addr string, c *corev1.Container) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: RECMESH_METRICS_ADDR=%q: %v; want \":port\" (the default is loopback only)", where, addr, err)
		return
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("%s: RECMESH_METRICS_ADDR=%q is not reachable from outside the pod; want \":port\"", where, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || !hasPort(c, intstr.FromInt32(int32(n))) {
		t.Errorf("%s: RECMESH_METRICS_ADDR=%q: the container declares no such port", where, addr)
	}
}

func metaSelector(m map[string]string) (labels.Selector, error) {
	if len(m) == 0 {
		return nil, fmt.Errorf("empty selector")
	}
	return labels.SelectorFromSet(m), nil
}

// checkProbePort: a probe's port is one the container declares.
func checkProbePort(t *testing.T, where, kind string, c *corev1.Container, p *corev1.Probe) {
	var port intstr.IntOrString
	switch {
	case p.HTTPGet != nil:
		port = p.HTTPGet.Port
	case p.TCPSocket != nil:
		port = p.TCPSocket.Port
	case p.GRPC != nil:
		port = intstr.FromInt32(p.GRPC.Port)
	case p.Exec != nil:
		return
	default:
		t.Errorf("%s: %s probe has no handler", where, kind)
		return
	}
	if !hasPort(c, port) {
		t.Errorf("%s: %s probe port %s is not a port of the container", where, kind, port.String())
	}
}

func hasPort(c *corev1.Container, port intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (port.Type == intstr.String && cp.Name == port.StrVal) || (port.Type == intstr.Int && cp.ContainerPort == port.IntVal) {
			return true
		}
	}
	return false
}

// checkServing: the serving pod runs the three processes in one PID
// namespace, sharing the segment at the directory they are told to use.
func checkServing(t *testing.T, r *rendered, shm string, gpu bool) {
	d := r.deployments["recmesh-serving"]
	if d == nil {
		t.Fatal("no recmesh-serving Deployment")
	}
	spec := &d.Spec.Template.Spec
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
		t.Error("the serving pod does not share its process namespace (liveness checks use pids)")
	}
	lanes := defaultLaneCount
	var shmMounts []string
	for _, name := range Processes {
		c := container(spec, name)
		if c == nil {
			t.Errorf("the serving pod has no %s container", name)
			continue
		}
		if !strings.Contains(c.Image, "recmesh/"+name) {
			t.Errorf("serving container %s runs image %s", name, c.Image)
		}
		dir, ok := r.containerEnv(c, "RECMESH_SHM_DIR")
		if !ok {
			t.Errorf("serving container %s has no RECMESH_SHM_DIR", name)
		}
		if v, ok := r.containerEnv(c, "RECMESH_LANES"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Errorf("RECMESH_LANES=%q: %v", v, err)
			}
			lanes = max(lanes, n)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.Name == "shm" {
				mounted = segmentDirIn(dir, m.MountPath) && !m.ReadOnly
				shmMounts = append(shmMounts, m.MountPath)
			}
		}
		if !mounted {
			t.Errorf("serving container %s does not mount the shm volume writable at RECMESH_SHM_DIR %q or the directory above", name, dir)
		}
	}
	checkFrontendUser(t, r, "the serving pod", spec, spec)
	// Two generations during a rollout, each reserved whole.
	need := resource.NewQuantity(2*segmentBytes(lanes), resource.BinarySI)
	v := volume(spec, "shm")
	if v == nil {
		t.Fatal("the serving pod has no shm volume")
	}
	emb := container(spec, Embedder)
	switch shm {
	case "Memory", "HugePages-2Mi":
		if v.EmptyDir == nil || string(v.EmptyDir.Medium) != shm {
			t.Fatalf("shm volume %+v; want an emptyDir of medium %s", v.VolumeSource, shm)
		}
		if shm == "Memory" {
			if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(*need) < 0 {
				t.Errorf("shm sizeLimit %v is below the %d-lane segment's %v", v.EmptyDir.SizeLimit, lanes, need)
			} else if emb != nil && emb.Resources.Limits.Memory().Cmp(*v.EmptyDir.SizeLimit) <= 0 {
				t.Errorf("embedder memory limit %v does not cover the shm volume's %v, which is charged to it", emb.Resources.Limits.Memory(), v.EmptyDir.SizeLimit)
			}
			break
		}
		// Huge pages: requested and limited alike, enough for the segment.
		hp := corev1.ResourceName("hugepages-2Mi")
		if emb == nil {
			break
		}
		lim, req := emb.Resources.Limits[hp], emb.Resources.Requests[hp]
		if lim.Cmp(req) != 0 || lim.Cmp(*need) < 0 {
			t.Errorf("embedder hugepages-2Mi request %v limit %v; want them equal and at least %v", &req, &lim, need)
		}
	case "hostPath":
		if v.HostPath == nil || v.EmptyDir != nil {
			t.Fatalf("shm volume %+v; want a hostPath only", v.VolumeSource)
		}
	}
	if gpu {
		acc := container(spec, Accelerator)
		if q := acc.Resources.Limits["nvidia.com/gpu"]; q.Value() < 1 {
			t.Errorf("accelerator limits %v; want an nvidia.com/gpu", acc.Resources.Limits)
		}
		if !strings.HasSuffix(acc.Image, "-cuda") {
			t.Errorf("accelerator image %s; want the CUDA build", acc.Image)
		}
	}
	// Some budget covers the serving pods.
	if !covered(r, d.Spec.Template.Labels) {
		t.Error("no PodDisruptionBudget selects the serving pods")
	}
}

func covered(r *rendered, podLabels map[string]string) bool {
	for _, pdb := range r.pdbs {
		if sel, err := metaSelector(pdb.Spec.Selector.MatchLabels); err == nil && sel.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}

// checkRouting: the Service reaches every pod that runs a frontend, at a
// port each of them declares.
func checkRouting(t *testing.T, r *rendered) {
	svc := r.services["recmesh"]
	if svc == nil {
		t.Fatal("no recmesh Service")
	}
	sel, err := metaSelector(svc.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	reached := 0
	for name, d := range r.deployments {
		fe := container(&d.Spec.Template.Spec, Frontend)
		matches := sel.Matches(labels.Set(d.Spec.Template.Labels))
		if (fe != nil) != matches {
			t.Errorf("deployment %s: runs a frontend %v, selected by the Service %v", name, fe != nil, matches)
		}
		if fe == nil || !matches {
			continue
		}
		reached++
		for _, p := range svc.Spec.Ports {
			if !hasPort(fe, p.TargetPort) {
				t.Errorf("deployment %s: the frontend has no port %s for Service port %s", name, p.TargetPort.String(), p.Name)
			}
		}
	}
	if reached == 0 {
		t.Error("the Service selects no frontend")
	}
}

// segmentDirIn reports whether the segment directory dir is the volume
// mounted at mount or a directory right inside it (which the embedder
// makes).
func segmentDirIn(dir, mount string) bool {
	return dir == mount || path.Dir(dir) == mount
}

// checkFrontendUser: the frontend of fePod runs as another user than the
// embedder of servingPod, in the embedder's group, trusting the embedder's
// uid, and the embedder shares its socket with that group from a segment
// directory it makes inside the shm volume (docs/security.md, "Frontends as
// another user"): a frontend of the embedder's own user could signal it in
// the shared PID namespace, and one that could write the segment directory
// could remove or replace the embedder's socket.
func checkFrontendUser(t *testing.T, r *rendered, where string, fePod, servingPod *corev1.PodSpec) {
	t.Helper()
	fe, emb := container(fePod, Frontend), container(servingPod, Embedder)
	if fe == nil || emb == nil {
		return
	}
	feUID, feGroups := identity(fePod, fe)
	embUID, embGroups := identity(servingPod, emb)
	if feUID < 0 || embUID < 0 || feUID == embUID {
		t.Errorf("%s: the frontend runs as uid %d, the embedder as %d; want two users, both set", where, feUID, embUID)
	}
	if len(embGroups) == 0 || !slices.Contains(feGroups, embGroups[0]) {
		t.Errorf("%s: the frontend's groups %v lack the embedder's group %v", where, feGroups, embGroups)
	}
	if v, _ := r.containerEnv(emb, "RECMESH_SEGMENT_MODE"); v != "0660" {
		t.Errorf("%s: the embedder's RECMESH_SEGMENT_MODE is %q; want 0660, for its group", where, v)
	}
	if v, _ := r.containerEnv(fe, "RECMESH_SEGMENT_OWNER_UID"); v != strconv.FormatInt(embUID, 10) {
		t.Errorf("%s: the frontend's RECMESH_SEGMENT_OWNER_UID is %q; want the embedder's uid %d", where, v, embUID)
	}
	dir, _ := r.containerEnv(emb, "RECMESH_SHM_DIR")
	for _, m := range emb.VolumeMounts {
		if m.Name == "shm" && dir == m.MountPath {
			t.Errorf("%s: RECMESH_SHM_DIR %q is the shm volume itself, which the frontends may write; want a directory inside it for the embedder to make", where, dir)
		}
	}
}

// identity is the uid a container runs as (-1 when unset) and its groups:
// its primary group first, then the pod's fsGroup and supplemental groups.
func identity(pod *corev1.PodSpec, c *corev1.Container) (uid int64, groups []int64) {
	uid, gid := int64(-1), int64(-1)
	if sc := pod.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if gid >= 0 {
		groups = append(groups, gid)
	}
	if sc := pod.SecurityContext; sc != nil {
		if sc.FSGroup != nil {
			groups = append(groups, *sc.FSGroup)
		}
		groups = append(groups, sc.SupplementalGroups...)
	}
	return uid, groups
}

// checkFrontendDeployment: the separate frontends share the serving pods'
// node directory for the segment, land on their nodes, and are scaled by
// an HPA.
func checkFrontendDeployment(t *testing.T, r *rendered) {
	fd := r.deployments["recmesh-frontend"]
	serving := r.deployments["recmesh-serving"]
	if fd == nil || serving == nil {
		t.Fatal("want both recmesh-frontend and recmesh-serving Deployments")
	}
	fv, sv := volume(&fd.Spec.Template.Spec, "shm"), volume(&serving.Spec.Template.Spec, "shm")
	if fv == nil || fv.HostPath == nil || sv == nil || sv.HostPath == nil || fv.HostPath.Path != sv.HostPath.Path {
		t.Errorf("frontend and serving shm volumes differ: %+v vs %+v; want the same hostPath", fv, sv)
	}
	fe := container(&fd.Spec.Template.Spec, Frontend)
	if dir, _ := r.containerEnv(fe, "RECMESH_SHM_DIR"); !slices.ContainsFunc(fe.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "shm" && segmentDirIn(dir, m.MountPath)
	}) {
		t.Errorf("the frontend Deployment does not mount shm at RECMESH_SHM_DIR %q or the directory above", dir)
	}
	checkFrontendUser(t, r, "the frontend Deployment", &fd.Spec.Template.Spec, &serving.Spec.Template.Spec)
	aff := fd.Spec.Template.Spec.Affinity
	ok := false
	if aff != nil && aff.PodAffinity != nil {
		for _, term := range aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if term.TopologyKey != "kubernetes.io/hostname" || term.LabelSelector == nil {
				continue
			}
			if sel, err := metaSelector(term.LabelSelector.MatchLabels); err == nil && sel.Matches(labels.Set(serving.Spec.Template.Labels)) {
				ok = true
			}
		}
	}
	if !ok {
		t.Error("the frontend Deployment has no required pod affinity to the serving pods' nodes")
	}
	if fd.Spec.Replicas != nil {
		t.Errorf("the frontend Deployment sets replicas (%d); the HPA owns them", *fd.Spec.Replicas)
	}
	scaled := false
	for _, h := range r.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind == "Deployment" && ref.Name == fd.Name {
			scaled = true
			if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas || len(h.Spec.Metrics) == 0 {
				t.Errorf("HPA %s: min %v max %d metrics %d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas, len(h.Spec.Metrics))
			}
		}
	}
	if !scaled {
		t.Error("no HPA scales the frontend Deployment")
	}
	if !covered(r, fd.Spec.Template.Labels) {
		t.Error("no PodDisruptionBudget selects the frontend pods")
	}
	// hostPath is beyond the restricted and baseline Pod Security levels.
	if ns := r.namespaces["recmesh"]; ns == nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Error("the recmesh namespace does not allow hostPath volumes (pod-security enforce=privileged)")
	}
}

// TestK8sNATSClosed: NATS runs with the configuration recmesh
// nats-identities writes, from its Secret, and every recmesh container
// mounts its own role's Secret alone, read-only, and names the seed in
// NATS_NKEY, in every variant.
func TestK8sNATSClosed(t *testing.T) {
	for _, v := range k8sVariants {
		r := build(t, v.dir)
		// secrets maps a container to the Secrets it mounts.
		secrets := func(spec *corev1.PodSpec, c *corev1.Container) []string {
			var out []string
			for _, m := range c.VolumeMounts {
				vol := volume(spec, m.Name)
				if vol == nil || vol.Secret == nil {
					continue
				}
				out = append(out, vol.Secret.SecretName)
				if !m.ReadOnly {
					t.Errorf("%s: %s mounts Secret %s read-write", v.dir, c.Name, vol.Secret.SecretName)
				}
				if mode := vol.Secret.DefaultMode; mode == nil || *mode&0o007 != 0 {
					t.Errorf("%s: Secret volume %s has mode %v; want none for others", v.dir, vol.Name, mode)
				}
			}
			return out
		}
		n := r.deployments["nats"]
		if n == nil {
			t.Fatalf("%s: no nats Deployment", v.dir)
		}
		nc := container(&n.Spec.Template.Spec, "nats")
		if !slices.Contains(nc.Command, "-c") || !slices.Contains(nc.Command, "/nats/server/auth.conf") {
			t.Errorf("%s: nats command %v; want -c /nats/server/auth.conf", v.dir, nc.Command)
		}
		if got := secrets(&n.Spec.Template.Spec, nc); !slices.Equal(got, []string{"recmesh-nats-server"}) {
			t.Errorf("%s: nats mounts Secrets %v; want recmesh-nats-server", v.dir, got)
		}
		seen := map[string]bool{}
		for _, d := range r.deployments {
			spec := &d.Spec.Template.Spec
			for i := range spec.Containers {
				c := &spec.Containers[i]
				if !slices.Contains(Processes, c.Name) {
					continue
				}
				seen[c.Name] = true
				if got, want := secrets(spec, c), []string{"recmesh-nats-" + c.Name}; !slices.Equal(got, want) {
					t.Errorf("%s: %s/%s mounts Secrets %v; want %v", v.dir, d.Name, c.Name, got, want)
				}
				if got, _ := r.containerEnv(c, "NATS_NKEY"); got != "/nats/"+c.Name+"/"+c.Name+".nk" {
					t.Errorf("%s: %s/%s NATS_NKEY=%q", v.dir, d.Name, c.Name, got)
				}
			}
		}
		for _, p := range Processes {
			if !seen[p] {
				t.Errorf("%s: no %s container", v.dir, p)
			}
		}
	}
}

// TestK8sQueueTimeHPA: the queue-time component scales the frontends on a
// per-pod metric derived from counters the frontends export, and only
// that.
func TestK8sQueueTimeHPA(t *testing.T) {
	r := build(t, "overlays/frontend-queue-hpa")
	if len(r.hpas) != 1 {
		t.Fatalf("%d HPAs; want 1", len(r.hpas))
	}
	m := r.hpas[0].Spec.Metrics
	if len(m) != 1 || m[0].Type != autoscalingv2.PodsMetricSourceType || m[0].Pods == nil {
		t.Fatalf("HPA metrics %+v; want one Pods metric", m)
	}
	if got := m[0].Pods.Metric.Name; got != "recmesh_frontend_queue_us_per_request" {
		t.Errorf("HPA metric %q", got)
	}
	if v := m[0].Pods.Target.AverageValue; v == nil || v.Sign() <= 0 {
		t.Errorf("HPA target %+v; want a positive average value", m[0].Pods.Target)
	}
	// The adapter rule (docs/deployment.md) divides these two counters.
	for _, name := range []string{"nv_inference_queue_duration_us", "nv_inference_count"} {
		if !slices.ContainsFunc(Metrics, func(d Metric) bool { return d.Name == name && slices.Contains(d.Processes, Frontend) }) {
			t.Errorf("the frontends do not export %s", name)
		}
	}
}
