package frontend

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/recmesh/recmesh/proto/inference"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a certificate with serial for 127.0.0.1 (server) or a
// client, and its key, into dir; it returns their paths.
func (ca *testCA) issue(t *testing.T, dir, name string, serial int64, client bool) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	// Write beside, then rename: a rotation replaces whole files.
	for path, b := range map[string][]byte{
		certPath: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPath:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	return certPath, keyPath
}

// callTLS makes one ServerLive call over a new TLS connection and returns
// the serial of the certificate the server presented.
func callTLS(t *testing.T, addr string, cfg *tls.Config) (int64, error) {
	t.Helper()
	var serial int64
	cfg = cfg.Clone()
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		serial = cs.PeerCertificates[0].SerialNumber.Int64()
		return nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = inference.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &inference.ServerLiveRequest{})
	return serial, err
}

// TestTLSAndMutualTLS serves over TLS, then mutual TLS: a client that
// trusts the CA gets through, one that does not is refused, and under
// mTLS a client without a certificate is refused. A rotated certificate
// is served to new connections without a restart.
func TestTLSAndMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "recmesh-test-ca")
	serverCert, serverKey := ca.issue(t, dir, "server", 10, false)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	client := &tls.Config{RootCAs: roots, ServerName: "localhost"}

	ts := startServer(t, newFakeBackend(), func(o *Options) { o.TLSCert, o.TLSKey = serverCert, serverKey })
	addr := ts.srv.Addr().String()
	if serial, err := callTLS(t, addr, client); err != nil || serial != 10 {
		t.Fatalf("TLS call: serial %d, %v", serial, err)
	}
	if _, err := callTLS(t, addr, &tls.Config{ServerName: "localhost"}); err == nil {
		t.Fatal("a client that does not trust the CA got through")
	}
	// Rotation: new files, same paths; new connections get the new one.
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	ca.issue(t, dir, "server", 11, false)
	deadline := time.Now().Add(5 * time.Second)
	for {
		serial, err := callTLS(t, addr, client)
		if err == nil && serial == 11 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after rotation the server still presents serial %d (%v)", serial, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A replacement that keeps the old modification time (cp -p, tar) and
	// is the same size is a rotation too.
	st, err := os.Stat(serverCert)
	if err != nil {
		t.Fatal(err)
	}
	ca.issue(t, dir, "server", 12, false)
	for _, p := range []string{serverCert, serverKey} {
		if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		serial, err := callTLS(t, addr, client)
		if err == nil && serial == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a rotation with the old modification time the server still presents serial %d (%v)", serial, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Mutual TLS.
	caFile := filepath.Join(dir, "clients-ca.pem")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	mts := startServer(t, newFakeBackend(), func(o *Options) {
		o.TLSCert, o.TLSKey, o.TLSClientCA = serverCert, serverKey, caFile
	})
	maddr := mts.srv.Addr().String()
	if _, err := callTLS(t, maddr, client); err == nil {
		t.Fatal("mutual TLS let in a client without a certificate")
	}
	clientCert, clientKey := ca.issue(t, dir, "client", 20, true)
	pair, err := tls.LoadX509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	withCert := client.Clone()
	withCert.Certificates = []tls.Certificate{pair}
	if _, err := callTLS(t, maddr, withCert); err != nil {
		t.Fatalf("mutual TLS refused a client the CA signed: %v", err)
	}
}

// TestTLSOptionErrors: unusable TLS settings fail at start-up naming the
// option and the file.
func TestTLSOptionErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	cert, key := ca.issue(t, dir, "server", 1, false)
	_, otherKey := ca.issue(t, dir, "other", 2, false)
	for _, tc := range []struct {
		name string
		edit func(*Options)
	}{
		{"cert without key", func(o *Options) { o.TLSCert = cert }},
		{"client CA without cert", func(o *Options) { o.TLSClientCA = cert }},
		{"missing cert", func(o *Options) { o.TLSCert, o.TLSKey = filepath.Join(dir, "nope.crt"), key }},
		{"mismatched key", func(o *Options) { o.TLSCert, o.TLSKey = cert, otherKey }},
		{"client CA not PEM", func(o *Options) { o.TLSCert, o.TLSKey, o.TLSClientCA = cert, key, key }},
	} {
		o := Options{Model: testConfig(), Backend: newFakeBackend(), MetricsAddr: MetricsOff, Logger: discardLogger()}
		tc.edit(&o)
		_, err := New(o)
		var oe *OptionError
		if !errors.As(err, &oe) || (oe.Option != "TLSCert" && oe.Option != "TLSClientCA") {
			t.Errorf("%s: New = %v, want an OptionError naming TLS", tc.name, err)
		}
	}
}
