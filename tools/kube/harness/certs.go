package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is what kube-apiserver needs on loopback: a CA, a serving certificate for 127.0.0.1
// signed by it, a service-account key pair, and a bearer token for a system:masters user.
type pki struct {
	dir                  string
	caCert, caPEM        string
	servingCert, servKey string
	saKey, saPub         string
	tokenFile, token     string
}

func writePEM(path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		panic(err)
	}
}

func newPKI(dir string) *pki {
	p := &pki{dir: dir}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "watchcache-kube-harness-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.caCert = filepath.Join(dir, "ca.crt")
	writePEM(p.caCert, "CERTIFICATE", caDER)
	p.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))

	servKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	servTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	servDER, err := x509.CreateCertificate(rand.Reader, servTmpl, ca, &servKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	p.servingCert = filepath.Join(dir, "serving.crt")
	writePEM(p.servingCert, "CERTIFICATE", servDER)
	kb, _ := x509.MarshalECPrivateKey(servKey)
	p.servKey = filepath.Join(dir, "serving.key")
	writePEM(p.servKey, "EC PRIVATE KEY", kb)

	sa, _ := rsa.GenerateKey(rand.Reader, 2048)
	p.saKey = filepath.Join(dir, "sa.key")
	writePEM(p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa))
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	p.saPub = filepath.Join(dir, "sa.pub")
	writePEM(p.saPub, "PUBLIC KEY", pub)

	b := make([]byte, 16)
	_, _ = rand.Read(b)
	p.token = hex.EncodeToString(b)
	p.tokenFile = filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(p.tokenFile, []byte(p.token+`,admin,uid-admin,"system:masters"`+"\n"), 0o600); err != nil {
		panic(err)
	}
	return p
}
