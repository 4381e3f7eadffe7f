// Package testpki makes certificate authorities and certificates for
// tests of TLS listeners and clients, with crypto/x509: ECDSA P-256 keys,
// PEM files.
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, PEM-encoded.
	PEM []byte
}

// Leaf describes a certificate to issue. Zero times mean valid from an
// hour ago for a day.
type Leaf struct {
	CommonName string
	DNS        []string
	IPs        []net.IP
	// Client makes a client certificate (extended key usage clientAuth);
	// otherwise a server certificate.
	Client    bool
	NotBefore time.Time
	NotAfter  time.Time
}

// Localhost is a server certificate for 127.0.0.1, ::1 and localhost.
func Localhost(cn string) Leaf {
	return Leaf{CommonName: cn, DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue signs a certificate for l and returns it and its key, PEM-encoded.
func (ca *CA) Issue(t testing.TB, l Leaf) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	nb, na := l.NotBefore, l.NotAfter
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	if na.IsZero() {
		na = time.Now().Add(24 * time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.CommonName},
		NotBefore:    nb,
		NotAfter:     na,
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// WriteFiles issues a certificate for l and writes it and its key to
// dir/name.crt and dir/name.key; it returns their paths.
func (ca *CA) WriteFiles(t testing.TB, dir, name string, l Leaf) (certFile, keyFile string) {
	t.Helper()
	c, k := ca.Issue(t, l)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	WriteFile(t, certFile, c)
	WriteFile(t, keyFile, k)
	return certFile, keyFile
}

// WriteCA writes the CA's certificate to dir/name.crt and returns its path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name+".crt")
	WriteFile(t, p, ca.PEM)
	return p
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientCert issues a client certificate for tls.Config.Certificates.
func (ca *CA) ClientCert(t testing.TB, cn string) tls.Certificate {
	t.Helper()
	c, k := ca.Issue(t, Leaf{CommonName: cn, Client: true})
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// WriteFile writes b to p atomically (a temporary file renamed over p),
// as tools that rotate certificates do.
func WriteFile(t testing.TB, p string, b []byte) {
	t.Helper()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// JWK is one public key of a JSON Web Key Set.
type JWK struct {
	Kid string
	Alg string // RS256, ES256...
	Key crypto.PublicKey
}

// JWKS returns the JSON Web Key Set of keys (RSA and ECDSA P-256 public
// keys), as an identity provider publishes it.
func JWKS(t testing.TB, keys ...JWK) []byte {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	for _, k := range keys {
		m := map[string]string{"kid": k.Kid, "alg": k.Alg, "use": "sig"}
		switch pk := k.Key.(type) {
		case *rsa.PublicKey:
			m["kty"], m["n"], m["e"] = "RSA", b64(pk.N.Bytes()), b64(big.NewInt(int64(pk.E)).Bytes())
		case *ecdsa.PublicKey:
			ecdh, err := pk.ECDH()
			if err != nil {
				t.Fatal(err)
			}
			raw := ecdh.Bytes() // 0x04 || X || Y
			n := (len(raw) - 1) / 2
			m["kty"], m["crv"], m["x"], m["y"] = "EC", "P-256", b64(raw[1:1+n]), b64(raw[1+n:])
		default:
			t.Fatalf("JWKS: unsupported key type %T", k.Key)
		}
		set.Keys = append(set.Keys, m)
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RSAKey makes a 2048-bit RSA key.
func RSAKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// ECKey makes an ECDSA P-256 key.
func ECKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	return newKey(t)
}

// Certs are the files WriteCerts writes, by path.
type Certs struct {
	// CA signed the server's and the client's certificates.
	CA string
	// ServerCert and ServerKey are valid for 127.0.0.1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey authenticate the role given to WriteCerts
	// (their common name).
	ClientCert, ClientKey string
	// OtherCA signed only OtherClientCert (OtherClientKey), a client
	// certificate for the same role that a server trusting CA refuses; as a
	// client's root it is a wrong CA.
	OtherCA, OtherClientCert, OtherClientKey string
	// ExpiredClientCert and ExpiredClientKey are a client certificate of CA
	// for the role that expired yesterday.
	ExpiredClientCert, ExpiredClientKey string
	// Signer is the CA of the file CA, to issue more certificates.
	Signer *CA
}

// WriteCerts makes two CAs and the certificates of Certs into dir.
func WriteCerts(t testing.TB, dir, role string) *Certs {
	t.Helper()
	ca, other := NewCA(t, "pgtest CA"), NewCA(t, "pgtest other CA")
	c := &Certs{Signer: ca, CA: ca.WriteCA(t, dir, "ca"), OtherCA: other.WriteCA(t, dir, "other-ca")}
	c.ServerCert, c.ServerKey = ca.WriteFiles(t, dir, "server", Localhost("localhost"))
	c.ClientCert, c.ClientKey = ca.WriteFiles(t, dir, "client", Leaf{CommonName: role, Client: true})
	c.OtherClientCert, c.OtherClientKey = other.WriteFiles(t, dir, "other-client", Leaf{CommonName: role, Client: true})
	c.ExpiredClientCert, c.ExpiredClientKey = ca.WriteFiles(t, dir, "expired-client", Leaf{CommonName: role, Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	return c
}

// Server issues a server certificate of CA for l, for a server built in
// the test (tls.Config.Certificates).
func (c *Certs) Server(t testing.TB, l Leaf) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := c.Signer.Issue(t, l)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Mutual returns a server TLS configuration presenting cert and requiring
// client certificates of CA (nats-server's verify: true).
func (c *Certs) Mutual(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: c.Signer.Pool(), MinVersion: tls.VersionTLS12}
}
