package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestKServeExample decodes deploy/kserve/recmesh.yaml and checks the
// fields KServe reads to serve a gRPC v2 runtime: the InferenceService
// names the runtime and a format it supports, over grpc-v2, with a
// storageUri; the runtime's kserve-container exposes the frontend's gRPC
// port named h2c; every recmesh container reads the bundle from
// /mnt/models, where KServe's storage initializer puts it; the containers
// share a memory-backed /dev/shm for the segment.
func TestKServeExample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "kserve", "recmesh.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		objs[u.GetKind()] = u
	}
	rt, isvc := objs["ServingRuntime"], objs["InferenceService"]
	if rt == nil || isvc == nil {
		t.Fatalf("want a ServingRuntime and an InferenceService, have %v", objs)
	}
	if rt.GetAPIVersion() != "serving.kserve.io/v1alpha1" || isvc.GetAPIVersion() != "serving.kserve.io/v1beta1" {
		t.Errorf("apiVersions %s, %s", rt.GetAPIVersion(), isvc.GetAPIVersion())
	}
	str := func(u *unstructured.Unstructured, path ...string) string {
		v, _, err := unstructured.NestedString(u.Object, path...)
		if err != nil {
			t.Errorf("%s %v: %v", u.GetKind(), path, err)
		}
		return v
	}
	if got := str(isvc, "spec", "predictor", "model", "runtime"); got != rt.GetName() {
		t.Errorf("InferenceService runtime %q, want %q", got, rt.GetName())
	}
	if got := str(isvc, "spec", "predictor", "model", "protocolVersion"); got != "grpc-v2" {
		t.Errorf("InferenceService protocolVersion %q, want grpc-v2", got)
	}
	if str(isvc, "spec", "predictor", "model", "storageUri") == "" {
		t.Error("InferenceService has no storageUri")
	}
	format := str(isvc, "spec", "predictor", "model", "modelFormat", "name")
	formats, _, _ := unstructured.NestedSlice(rt.Object, "spec", "supportedModelFormats")
	supported := false
	for _, f := range formats {
		supported = supported || f.(map[string]any)["name"] == format
	}
	if !supported {
		t.Errorf("the runtime does not support the InferenceService's format %q: %v", format, formats)
	}
	protocols, _, _ := unstructured.NestedStringSlice(rt.Object, "spec", "protocolVersions")
	if !slices.Contains(protocols, "grpc-v2") {
		t.Errorf("runtime protocolVersions %v lack grpc-v2", protocols)
	}

	containers, _, _ := unstructured.NestedSlice(rt.Object, "spec", "containers")
	if len(containers) == 0 {
		t.Fatal("runtime has no containers")
	}
	first := containers[0].(map[string]any)
	if first["name"] != "kserve-container" {
		t.Errorf("first container %v, want kserve-container (the one KServe routes to)", first["name"])
	}
	ports, _ := first["ports"].([]any)
	if len(ports) != 1 {
		t.Fatalf("kserve-container ports %v, want the one gRPC port", ports)
	}
	p := ports[0].(map[string]any)
	if p["name"] != "h2c" || p["protocol"] != "TCP" || p["containerPort"] != float64(8001) && p["containerPort"] != int64(8001) {
		t.Errorf("kserve-container port %v, want h2c TCP 8001", p)
	}
	for _, c := range containers {
		c := c.(map[string]any)
		bundle, shm := false, false
		metrics := ""
		for _, e := range asSlice(c["env"]) {
			e := e.(map[string]any)
			bundle = bundle || (e["name"] == "RECMESH_BUNDLE" && e["value"] == "/mnt/models")
			if e["name"] == "RECMESH_METRICS_ADDR" {
				metrics, _ = e["value"].(string)
			}
		}
		// /metrics binds loopback unless told otherwise; Prometheus scrapes
		// from outside the pod.
		if !strings.HasPrefix(metrics, ":") {
			t.Errorf("container %v: RECMESH_METRICS_ADDR=%q; want \":port\" (every interface)", c["name"], metrics)
		}
		for _, m := range asSlice(c["volumeMounts"]) {
			shm = shm || m.(map[string]any)["mountPath"] == "/dev/shm"
		}
		if !bundle || !shm {
			t.Errorf("container %v: bundle from /mnt/models %v, /dev/shm mounted %v", c["name"], bundle, shm)
		}
	}
	checkKServeUsers(t, containers)
	volumes, _, _ := unstructured.NestedSlice(rt.Object, "spec", "volumes")
	memory := false
	for _, v := range volumes {
		if ed, ok := v.(map[string]any)["emptyDir"].(map[string]any); ok {
			memory = memory || ed["medium"] == "Memory"
		}
	}
	if !memory {
		t.Errorf("runtime volumes %v: no memory-backed emptyDir for /dev/shm", volumes)
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// checkKServeUsers: the frontend (kserve-container) runs as another user
// than the embedder, in its group, trusting its uid, and every process
// uses the segment directory the embedder makes inside /dev/shm, as the
// Kubernetes manifests do (checkFrontendUser).
func checkKServeUsers(t *testing.T, containers []any) {
	t.Helper()
	type identity struct {
		uid, gid any
		env      map[string]any
	}
	ids := map[string]identity{}
	for _, c := range containers {
		c := c.(map[string]any)
		sc, _ := c["securityContext"].(map[string]any)
		id := identity{env: map[string]any{}}
		if sc != nil {
			id.uid, id.gid = sc["runAsUser"], sc["runAsGroup"]
		}
		for _, e := range asSlice(c["env"]) {
			e := e.(map[string]any)
			id.env[e["name"].(string)] = e["value"]
		}
		ids[c["name"].(string)] = id
	}
	fe, emb, acc := ids["kserve-container"], ids[Embedder], ids[Accelerator]
	if fe.uid == nil || emb.uid == nil || fe.uid == emb.uid || acc.uid != emb.uid {
		t.Errorf("users: frontend %v, embedder %v, accelerator %v; want the frontend apart, the accelerator the embedder's", fe.uid, emb.uid, acc.uid)
	}
	if fe.gid == nil || fe.gid != emb.gid {
		t.Errorf("groups: frontend %v, embedder %v; want the frontend in the embedder's group", fe.gid, emb.gid)
	}
	if emb.env["RECMESH_SEGMENT_MODE"] != "0660" {
		t.Errorf("embedder RECMESH_SEGMENT_MODE %v; want 0660, for its group", emb.env["RECMESH_SEGMENT_MODE"])
	}
	if fmt.Sprint(fe.env["RECMESH_SEGMENT_OWNER_UID"]) != fmt.Sprint(emb.uid) {
		t.Errorf("frontend RECMESH_SEGMENT_OWNER_UID %v; want the embedder's uid %v", fe.env["RECMESH_SEGMENT_OWNER_UID"], emb.uid)
	}
	for name, id := range ids {
		if dir, _ := id.env["RECMESH_SHM_DIR"].(string); !segmentDirIn(dir, "/dev/shm") || dir == "/dev/shm" {
			t.Errorf("container %s: RECMESH_SHM_DIR %q; want a directory inside /dev/shm for the embedder to make", name, dir)
		}
	}
}
