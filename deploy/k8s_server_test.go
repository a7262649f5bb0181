package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// k8sBinEnv names the directory holding etcd, kube-apiserver and kubectl
// as built from their Go modules (make k8s-server-test builds them).
const k8sBinEnv = "RECMESH_K8S_BIN"

// k8sRecmeshEnv names the recmesh binary, whose nats-identities writes the
// Secrets the manifests mount.
const k8sRecmeshEnv = "RECMESH_K8S_RECMESH"

// TestK8sServer applies every kustomization to a real API server (etcd and
// kube-apiserver, Pod Security admission on, as every cluster has it) and
// fails on anything the server refuses or warns about:
//
//   - deploy/k8s/base with `kubectl apply -k`, as the docs tell users;
//   - every variant into a namespace of its own, so each is judged by the
//     Pod Security level its own Namespace sets;
//   - a Pod made from every Deployment's template, created with
//     --dry-run=server: Pod Security enforces on Pods (it only warns on
//     their controllers), and the Pod validation (resources, huge pages,
//     probes) is the kubelet's contract.
//
// The server runs no controllers or nodes: what it checks is what the API
// accepts. make k8s-test runs the manifests for real.
func TestK8sServer(t *testing.T) {
	bin := os.Getenv(k8sBinEnv)
	if bin == "" {
		t.Skip("make k8s-server-test runs this (" + k8sBinEnv + " names the built etcd, kube-apiserver and kubectl)")
	}
	recmesh := os.Getenv(k8sRecmeshEnv)
	if recmesh == "" {
		t.Fatalf("%s must name the recmesh binary (make k8s-server-test sets it)", k8sRecmeshEnv)
	}
	for _, c := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, c)); err != nil {
			t.Fatalf("%s: %v (make k8s-server-test builds it)", c, err)
		}
	}
	api := startAPIServer(t, bin)
	api.recmesh = recmesh
	var version struct {
		Server struct {
			GitVersion string `json:"gitVersion"`
		} `json:"serverVersion"`
	}
	if err := yaml.Unmarshal([]byte(api.kubectl(t, nil, "version", "-o", "yaml")), &version); err != nil {
		t.Fatal(err)
	}
	if version.Server.GitVersion == "" {
		t.Fatal("kubectl version: no server version")
	}

	// The base as users apply it.
	out := api.kubectl(t, nil, "apply", "-k", filepath.Join(k8sDir, "base"))
	t.Logf("kubectl apply -k %s/base:\n%s", k8sDir, out)
	api.applied += strings.Count(strings.TrimSpace(out), "\n") + 1
	api.secrets(t, "recmesh")
	api.checkPods(t, build(t, "base"), "recmesh")

	for _, v := range k8sVariants {
		t.Run(strings.ReplaceAll(v.dir, "/", "_"), func(t *testing.T) {
			ns := "recmesh-" + strings.ReplaceAll(strings.TrimPrefix(v.dir, "overlays/"), "/", "-")
			r := build(t, v.dir)
			api.apply(t, r, ns)
			api.secrets(t, ns)
			api.checkPods(t, r, ns)
		})
	}
	if !t.Failed() {
		fmt.Printf("k8s-server ok: server=%s variants=%d objects_applied=%d pods_admitted=%d warnings=0\n",
			version.Server.GitVersion, 1+len(k8sVariants), api.applied, api.pods)
	}
}

// apiServer is a running etcd and kube-apiserver, and a kubeconfig for an
// administrator.
type apiServer struct {
	bin        string
	recmesh    string
	kubeconfig string
	applied    int // objects created
	pods       int // Pods admitted by --dry-run=server
}

// kubectl runs kubectl against the server; any warning the server sends
// (Pod Security, deprecations) fails the test.
func (a *apiServer) kubectl(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(a.bin, "kubectl"), append([]string{"--kubeconfig", a.kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "Warning:") {
			t.Errorf("kubectl %s: the server warned: %s", strings.Join(args, " "), line)
		}
	}
	return stdout.String()
}

// apply creates every object of r in namespace ns (its Namespace renamed
// to ns), with the server's strict field validation.
func (a *apiServer) apply(t *testing.T, r *rendered, ns string) {
	t.Helper()
	var docs [][]byte
	add := func(obj runtime.Object) {
		obj = obj.DeepCopyObject()
		o := obj.(metav1.Object)
		if _, ok := obj.(*corev1.Namespace); ok {
			o.SetName(ns)
		} else {
			o.SetNamespace(ns)
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	if len(r.namespaces) != 1 {
		t.Fatalf("%d namespaces rendered; want 1", len(r.namespaces))
	}
	for _, o := range r.namespaces {
		add(o)
	}
	for _, o := range r.configMaps {
		add(o)
	}
	for _, o := range r.services {
		add(o)
	}
	for _, o := range r.deployments {
		add(o)
	}
	for _, o := range r.pdbs {
		add(o)
	}
	for _, o := range r.hpas {
		add(o)
	}
	a.kubectl(t, bytes.Join(docs, []byte("\n---\n")), "apply", "--validate=strict", "-f", "-")
	a.applied += len(docs)
}

// secrets creates the NATS identities' Secrets in ns as the docs say:
// recmesh nats-identities --kubernetes-secrets, then kubectl apply.
func (a *apiServer) secrets(t *testing.T, ns string) {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command(a.recmesh, "nats-identities", "--out", dir, "--kubernetes-secrets", ns).CombinedOutput()
	if err != nil {
		t.Fatalf("recmesh nats-identities: %v\n%s", err, out)
	}
	res := a.kubectl(t, nil, "apply", "--validate=strict", "-f", filepath.Join(dir, "kubernetes-secrets.json"))
	a.applied += strings.Count(strings.TrimSpace(res), "\n") + 1
}

// checkPods creates, with --dry-run=server, a Pod from every Deployment's
// template in namespace ns: refused if it breaks the namespace's Pod
// Security level or the Pod API's rules.
func (a *apiServer) checkPods(t *testing.T, r *rendered, ns string) {
	t.Helper()
	if len(r.deployments) == 0 {
		t.Fatal("no Deployments rendered")
	}
	// A cluster's controller manager gives each namespace its default
	// service account; this server runs none.
	a.kubectl(t, nil, "create", "serviceaccount", "default", "--namespace", ns)
	for name, d := range r.deployments {
		pod := corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name + "-check", Namespace: ns, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
			Spec:       d.Spec.Template.Spec,
		}
		for _, v := range pod.Spec.Volumes {
			if v.Secret != nil {
				a.kubectl(t, nil, "get", "secret", v.Secret.SecretName, "--namespace", ns)
			}
		}
		b, err := yaml.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		out := a.kubectl(t, b, "create", "--dry-run=server", "--validate=strict", "-f", "-")
		t.Logf("%s: a Pod of Deployment %s: %s", ns, name, strings.TrimSpace(out))
		a.pods++
	}
}

// startAPIServer starts etcd and kube-apiserver on loopback ports with
// certificates of their own, and waits until the server is ready.
func startAPIServer(t *testing.T, bin string) *apiServer {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", ca.Raw)
	serving := issue(t, ca, caKey, "kube-apiserver", nil, []string{"localhost", "kubernetes", "kubernetes.default.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	serving.write(t, dir, "apiserver")
	admin := issue(t, ca, caKey, "recmesh-test-admin", []string{"system:masters"}, nil, nil)
	admin.write(t, dir, "admin")
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "sa.key"), "EC PRIVATE KEY", saDER)

	etcdClient, etcdPeer, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	startProcess(t, dir, filepath.Join(bin, "etcd"),
		"--name=recmesh-test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=recmesh-test="+peerURL, "--log-level=warn")
	startProcess(t, dir, filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(dir, "apiserver.key"),
		"--client-ca-file="+filepath.Join(dir, "ca.crt"),
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		// Pod Security is on by default; naming it makes a build without
		// it fail here rather than pass unchecked.
		"--enable-admission-plugins=PodSecurity",
		"--v=0")

	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, server, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")), 0o600); err != nil {
		t.Fatal(err)
	}

	// Ready once /readyz answers ok to the administrator: etcd reached,
	// every post-start hook (the bootstrap RBAC roles included) done.
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for {
		resp, err := client.Get(server + "/readyz")
		if err == nil {
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 3 minutes: %s (logs in %s)", last, dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return &apiServer{bin: bin, kubeconfig: kubeconfig}
}

// startProcess runs a server for the test's lifetime, its output in
// dir/<name>.log, shown when the test fails.
func startProcess(t *testing.T, dir, path string, args ...string) {
	t.Helper()
	name := filepath.Base(path)
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("%s log (end):\n%s", name, b)
		}
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "recmesh-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

type issued struct {
	der []byte
	key *ecdsa.PrivateKey
}

// issue signs a certificate for both serving and client use.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, orgs, dns []string, ips []net.IP) issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return issued{der: der, key: key}
}

func (c issued) write(t *testing.T, dir, name string) {
	t.Helper()
	writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", c.der)
	der, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".key"), "EC PRIVATE KEY", der)
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
