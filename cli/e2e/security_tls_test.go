package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// tlsResult is what checkTLS found: TLS and MTLS are "pass" or "fail";
// RotationFailedCalls counts the calls that failed or scored wrong while
// the server certificate rotated under load, out of Calls.
type tlsResult struct {
	TLS, MTLS           string
	RotationFailedCalls int
	Calls               int
}

// tlsAuthority is a throwaway CA for the TLS checks.
type tlsAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTLSAuthority(t *testing.T, name string) *tlsAuthority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tlsAuthority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate with a fresh key: a server one for
// 127.0.0.1 and localhost, or a client one.
func (ca *tlsAuthority) issue(t *testing.T, name string, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// writeTLSFile replaces path whole (write beside, then rename), so a
// reader never sees half a file.
func writeTLSFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tritonTLSOutcome is what triton_tls_client.py printed.
type tritonTLSOutcome struct {
	OK         bool      `json:"ok"`
	ServerLive bool      `json:"server_live"`
	Scores     []float32 `json:"scores"`
	Status     string    `json:"status"`
	Message    string    `json:"message"`
}

// checkTLS starts meshes of real processes with TLS and mutual TLS on the
// frontends' gRPC port and checks them with Triton's Python client and
// grpc-go: under mTLS a client with a certificate the CA signed infers
// correctly and one without is refused; under server-only TLS a client
// trusting the CA infers and a plaintext one is refused; and the server
// certificate and key, rotated on disk while 4 clients keep calling, reach
// new handshakes without a single failed or wrong call. Its clusters stop
// at the test's cleanup.
func checkTLS(t *testing.T) tlsResult {
	py, root := clientPython(t)
	script := filepath.Join(root, "frontend", "testdata", "triton_tls_client.py")
	w := loadWorkload(t)
	res := tlsResult{TLS: "fail", MTLS: "fail"}

	// Material: CA A signs the first server certificate and the client's;
	// CA B signs the rotated server certificate (a new key).
	dir := t.TempDir()
	caA, caB := newTLSAuthority(t, "recmesh-e2e-ca-a"), newTLSAuthority(t, "recmesh-e2e-ca-b")
	const serial1, serial2 = 1001, 2002
	srv1Cert, srv1Key := caA.issue(t, "recmesh-server-1", serial1, false)
	srv2Cert, srv2Key := caB.issue(t, "recmesh-server-2", serial2, false)
	cliCert, cliKey := caA.issue(t, "recmesh-client", 3003, true)
	path := func(name string) string { return filepath.Join(dir, name) }
	for name, b := range map[string][]byte{
		"server.crt": srv1Cert, "server.key": srv1Key, "tls-server.crt": srv1Cert, "tls-server.key": srv1Key,
		"client.crt": cliCert, "client.key": cliKey, "ca-a.pem": caA.pem,
	} {
		writeTLSFile(t, path(name), b)
	}
	cliPair, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	rootsA := x509.NewCertPool()
	rootsA.AddCert(caA.cert)
	rootsAB := x509.NewCertPool()
	rootsAB.AddCert(caA.cert)
	rootsAB.AddCert(caB.cert)

	// Inputs and reference scores for the Python client.
	const n = 4
	dense, sparse := model.RandomInputs(w.cfg, 17, n)
	b, err := model.Open(exportBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := model.NewReference(b)
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	want, err := ref.Predict(dense, sparse, n)
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]any{"n": n, "dense": dense, "sparse": sparse})
	inputs := path("inputs.json")
	if err := os.WriteFile(inputs, in, 0o644); err != nil {
		t.Fatal(err)
	}
	triton := func(addr string, args ...string) tritonTLSOutcome {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, append([]string{script, "--url", addr, "--inputs", inputs}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("triton_tls_client.py %v: %v\n%s", args, err, stderr.String())
		}
		var out tritonTLSOutcome
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatalf("triton_tls_client.py printed %q: %v", stdout.String(), err)
		}
		return out
	}
	scoresOK := func(o tritonTLSOutcome) bool {
		return o.OK && o.ServerLive && len(o.Scores) == n && maxAbsDiff(o.Scores, want) <= 1e-4
	}

	// Mutual TLS.
	mc := newCluster(t, "model")
	mc.segment += "-mtls" // a segment of its own beside the TLS cluster's
	mc.frontendArgs = []string{"--tls-cert", path("server.crt"), "--tls-key", path("server.key"), "--tls-client-ca", path("ca-a.pem")}
	mc.dialCreds = credentials.NewTLS(&tls.Config{RootCAs: rootsAB, Certificates: []tls.Certificate{cliPair}})
	mc.startMesh(2)
	authorised := triton(mc.addr(), "--ssl", "--root-certs", path("ca-a.pem"),
		"--private-key", path("client.key"), "--cert-chain", path("client.crt"))
	certless := triton(mc.addr(), "--ssl", "--root-certs", path("ca-a.pem"))
	t.Logf("mTLS: with a client certificate ok=%v scores=%v (reference %v); without one ok=%v %s %q",
		authorised.OK, authorised.Scores, want, certless.OK, certless.Status, certless.Message)
	if !scoresOK(authorised) {
		t.Errorf("mTLS: tritonclient with a client certificate: %+v, want scores %v", authorised, want)
	}
	if certless.OK {
		t.Errorf("mTLS: tritonclient without a client certificate got through")
	}
	if scoresOK(authorised) && !certless.OK {
		res.MTLS = "pass"
	}

	// Rotation under load, on the mTLS cluster.
	calls, failed, wrong, handshakes := rotateUnderLoad(t, mc, w, path("server.crt"), path("server.key"),
		srv2Cert, srv2Key, serial1, serial2, &tls.Config{RootCAs: rootsAB, Certificates: []tls.Certificate{cliPair}})
	res.Calls, res.RotationFailedCalls = calls, failed+wrong
	t.Logf("rotation: %d calls over %d connections, %d failed, %d wrong scores", calls, handshakes, failed, wrong)
	mc.stopAll() // its cleanup finds nothing left to stop

	// Server-only TLS: the certificate of CA A, no client CA.
	sc := newCluster(t, "model")
	sc.segment += "-tls"
	sc.frontendArgs = []string{"--tls-cert", path("tls-server.crt"), "--tls-key", path("tls-server.key")}
	sc.dialCreds = credentials.NewTLS(&tls.Config{RootCAs: rootsA})
	sc.startMesh(2)
	trusted := triton(sc.addr(), "--ssl", "--root-certs", path("ca-a.pem"))
	plain := triton(sc.addr(), "--timeout", "10")
	t.Logf("TLS: trusting the CA ok=%v scores=%v; plaintext ok=%v %s %q",
		trusted.OK, trusted.Scores, plain.OK, plain.Status, plain.Message)
	if !scoresOK(trusted) {
		t.Errorf("TLS: tritonclient trusting the CA: %+v, want scores %v", trusted, want)
	}
	if plain.OK {
		t.Errorf("TLS: a plaintext tritonclient got through")
	}
	if scoresOK(trusted) && !plain.OK {
		res.TLS = "pass"
	}
	return res
}

// rotateUnderLoad runs 4 grpc-go clients calling ModelInfer in a loop,
// each opening a new connection every few calls so handshakes go on
// throughout; after a second it replaces the certificate file, checks
// that handshakes still get oldSerial, replaces the key file, waits until
// fresh handshakes present serial, keeps the load up 2 more
// seconds and returns the calls made, those that failed, those that
// scored wrong and the connections opened.
func rotateUnderLoad(t *testing.T, c *cluster, w *workload, certPath, keyPath string, newCert, newKey []byte, oldSerial, serial int64, cfg *tls.Config) (calls, failed, wrong, conns int) {
	const clients, callsPerConn = 4, 4
	var nCalls, nFailed, nWrong, nConns atomic.Int64
	var firstErr sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; ; {
				conn, err := grpc.NewClient(c.addr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg.Clone())))
				if err != nil {
					t.Error(err)
					return
				}
				nConns.Add(1)
				client := pb.NewGRPCInferenceServiceClient(conn)
				for j := 0; j < callsPerConn; j++ {
					select {
					case <-stop:
						conn.Close()
						return
					default:
					}
					k := i % len(w.reqs)
					i++
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					resp, err := client.ModelInfer(ctx, w.reqs[k])
					cancel()
					nCalls.Add(1)
					if err != nil {
						nFailed.Add(1)
						firstErr.Do(func() { t.Logf("rotation: first failed call: %v", err) })
						continue
					}
					if got, err := oip.Scores(resp, w.n[k]); err != nil || maxAbsDiff(got, w.want[k]) > 1e-4 {
						nWrong.Add(1)
						firstErr.Do(func() { t.Logf("rotation: first wrong scores (request %d): %v", k, err) })
					}
				}
				conn.Close()
			}
		}(g)
	}

	time.Sleep(time.Second)
	before := nCalls.Load()
	// The certificate first, the key a while later: handshakes in between
	// find a pair that does not match, whose reload must fail and keep the
	// old pair serving.
	writeTLSFile(t, certPath, newCert)
	time.Sleep(1500 * time.Millisecond)
	for i := 0; i < 4; i++ {
		nCalls.Add(1)
		if got, subject, err := presentedSerial(c.addr(), cfg); err != nil || got != oldSerial {
			nFailed.Add(1)
			t.Logf("rotation: with the new certificate beside the old key a handshake saw serial %d (%s), %v; want the old %d", got, subject, err, oldSerial)
		}
	}
	writeTLSFile(t, keyPath, newKey)
	rotated := time.Now()
	// Fresh connections land on either frontend of the SO_REUSEPORT
	// group: wait until several in a row present the new certificate.
	const inARow = 8
	row, deadline := 0, rotated.Add(30*time.Second)
	var last string
	for row < inARow {
		got, subject, err := presentedSerial(c.addr(), cfg)
		switch {
		case err == nil && got == serial:
			row++
		case err != nil:
			row, last = 0, err.Error()
		default:
			row, last = 0, fmt.Sprintf("serial %d (%s)", got, subject)
		}
		if row < inARow && time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("rotation: new handshakes still see %s %v after the files changed", last, time.Since(rotated))
		}
		if row == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("rotation: new certificate served %v after the files changed (%d calls before)", time.Since(rotated).Round(time.Millisecond), before)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	return int(nCalls.Load()), int(nFailed.Load()), int(nWrong.Load()), int(nConns.Load())
}

// presentedSerial makes one ServerLive call over a new connection and
// returns the serial and subject of the certificate the server presented.
func presentedSerial(addr string, cfg *tls.Config) (int64, string, error) {
	var serial int64
	var subject string
	cfg = cfg.Clone()
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) > 0 {
			serial = cs.PeerCertificates[0].SerialNumber.Int64()
			subject = cs.PeerCertificates[0].Subject.CommonName
		}
		return nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pb.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &pb.ServerLiveRequest{})
	return serial, subject, err
}

// TestE2ETLS: TLS and mutual TLS on the real mesh, checked with Triton's
// Python client, and a certificate rotation under load that fails no call.
func TestE2ETLS(t *testing.T) {
	r := checkTLS(t)
	t.Logf("TLS %s, mTLS %s, rotation: %d calls, %d failed or wrong", r.TLS, r.MTLS, r.Calls, r.RotationFailedCalls)
	if r.TLS != "pass" || r.MTLS != "pass" {
		t.Errorf("TLS %s, mTLS %s, want pass and pass", r.TLS, r.MTLS)
	}
	if r.Calls == 0 || r.RotationFailedCalls != 0 {
		t.Errorf("rotation: %d calls, %d failed or wrong; want some calls and none failed", r.Calls, r.RotationFailedCalls)
	}
}
