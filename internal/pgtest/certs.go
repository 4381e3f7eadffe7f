package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority made for a test: an ECDSA P-256 key and a
// self-signed certificate.
type CA struct {
	// PEM is the CA's certificate, for ssl_ca_file or sslrootcert.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the key of CA %s: %w", name, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// Cert describes a certificate for CA.Issue.
type Cert struct {
	// CN is the subject's common name: for a client certificate, the role
	// it authenticates (pg_hba's cert method compares them).
	CN string
	// Hosts are the DNS names and IP addresses a server certificate is
	// valid for; none makes a client certificate.
	Hosts []string
	// NotBefore and NotAfter bound the validity; zero values mean from an
	// hour ago for a day.
	NotBefore, NotAfter time.Time
}

// Issue makes a certificate signed by ca and returns it and its key
// (PKCS #8), both PEM.
func (ca *CA) Issue(c Cert) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the key of %s: %w", c.CN, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: c.CN},
		NotBefore:    c.NotBefore,
		NotAfter:     c.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	if len(c.Hosts) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range c.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the certificate of %s: %w", c.CN, err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}

// Certs are the files WriteCerts writes, by path.
type Certs struct {
	// CA signed the server's and the client's certificates.
	CA string
	// ServerCert and ServerKey are valid for 127.0.0.1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey authenticate the role given to WriteCerts.
	ClientCert, ClientKey string
	// OtherCA signed only OtherClientCert (OtherClientKey), a client
	// certificate for the same role that a server trusting CA refuses; as
	// sslrootcert it is a wrong CA.
	OtherCA, OtherClientCert, OtherClientKey string
	// Signer is the CA of the file CA, to issue more certificates.
	Signer *CA
}

// WriteCerts makes two CAs and the certificates of Certs into dir.
func WriteCerts(dir, role string) (*Certs, error) {
	ca, err := NewCA("pgtest CA")
	if err != nil {
		return nil, err
	}
	other, err := NewCA("pgtest other CA")
	if err != nil {
		return nil, err
	}
	c := &Certs{Signer: ca}
	files := []struct {
		name string
		ca   *CA
		cert Cert
		dst  [2]*string
	}{
		{"server", ca, Cert{CN: "localhost", Hosts: []string{"127.0.0.1", "localhost"}}, [2]*string{&c.ServerCert, &c.ServerKey}},
		{"client", ca, Cert{CN: role}, [2]*string{&c.ClientCert, &c.ClientKey}},
		{"other-client", other, Cert{CN: role}, [2]*string{&c.OtherClientCert, &c.OtherClientKey}},
	}
	c.CA = filepath.Join(dir, "ca.crt")
	c.OtherCA = filepath.Join(dir, "other-ca.crt")
	if err := errors.Join(os.WriteFile(c.CA, ca.PEM, 0o600), os.WriteFile(c.OtherCA, other.PEM, 0o600)); err != nil {
		return nil, err
	}
	for _, f := range files {
		if *f.dst[0], *f.dst[1], err = f.ca.WriteFiles(dir, f.name, f.cert); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// WriteFiles issues a certificate for c and writes it and its key into
// dir as name.crt and name.key (mode 0600), returning their paths.
func (ca *CA) WriteFiles(dir, name string, c Cert) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := ca.Issue(c)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := errors.Join(os.WriteFile(certFile, certPEM, 0o600), os.WriteFile(keyFile, keyPEM, 0o600)); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// TLS returns the server's files of c, for Options.TLS: the server
// certificate, and CA for the client certificates it accepts.
func (c *Certs) TLS() *TLS {
	return &TLS{CertFile: c.ServerCert, KeyFile: c.ServerKey, CAFile: c.CA}
}

// serial returns a random certificate serial number.
func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}
