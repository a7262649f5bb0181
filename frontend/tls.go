package frontend

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// tlsFiles serves the frontend's TLS material from files and reloads it
// when they change, so certificates rotate without a restart and without
// touching connections already open: every new handshake asks for the
// current certificate (and, for mutual TLS, the current client CA pool).
type tlsFiles struct {
	cert, key, caFile string

	mu       sync.Mutex
	checked  time.Time         // last look at the files
	stamp    [sha256.Size]byte // a hash of their contents when last loaded
	pair     *tls.Certificate
	clientCA *x509.CertPool // nil: no mutual TLS
}

// tlsRecheck bounds how often handshakes look at the files.
const tlsRecheck = time.Second

// newTLSFiles loads the files once, so a missing, unreadable or
// mismatched file fails at start-up with an error naming it.
func newTLSFiles(cert, key, clientCA string) (*tlsFiles, error) {
	f := &tlsFiles{cert: cert, key: key, caFile: clientCA}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// fingerprint hashes the files' contents: modification times miss a
// replacement copied with its old time (cp -p, tar) at the same size, and
// the files are a few KiB read once a second at most.
func (f *tlsFiles) fingerprint() ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, p := range []string{f.cert, f.key, f.caFile} {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, nil
}

func (f *tlsFiles) load() error {
	stamp, err := f.fingerprint()
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return fmt.Errorf("tls: certificate %s and key %s: %w", f.cert, f.key, err)
	}
	var pool *x509.CertPool
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return fmt.Errorf("tls: client CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls: client CA %s holds no PEM certificate", f.caFile)
		}
	}
	f.pair, f.clientCA, f.stamp = &pair, pool, stamp
	return nil
}

// current returns the material, reloading it when the files changed. A
// reload that fails (a rotation caught half-written) keeps serving the
// previous material and tries again later.
func (f *tlsFiles) current() (*tls.Certificate, *x509.CertPool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= tlsRecheck {
		f.checked = now
		if stamp, err := f.fingerprint(); err == nil && stamp != f.stamp {
			_ = f.load()
		}
	}
	return f.pair, f.clientCA
}

// config is the server's TLS configuration: TLS 1.2 or later, and with a
// client CA, mutual TLS (a client without a certificate the CA signed is
// refused during the handshake).
func (f *tlsFiles) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pair, pool := f.current()
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*pair}, NextProtos: []string{"h2"}}
			if pool != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
			}
			return c, nil
		},
	}
}
