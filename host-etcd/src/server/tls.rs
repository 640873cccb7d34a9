//! TLS on the gRPC port, and from it to etcd for HTTP/1 that is passed through: rustls (the one
//! tonic builds) configured from the PEM files the operator gives, as etcd's own `--cert-file`,
//! `--key-file`, `--trusted-ca-file` with `--client-cert-auth`, and ALPN as etcd's TLS port
//! offers it.
//!
//! etcd counterpart: `client/pkg/transport/listener.go` (`TLSInfo.ServerConfig`,
//! `ClientConfig`).

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::ServerTls;
use crate::upstream::EtcdTls;

/// The server's TLS: its certificate, clients' certificates checked against `client_ca_pem`
/// when given (then required, as tonic's and etcd's `--client-cert-auth`), and ALPN `h2` then
/// `http/1.1`, as etcd's TLS port offers them.
pub(crate) fn acceptor(tls: &ServerTls) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("server TLS: {e}"))?;
    let builder = match &tls.client_ca_pem {
        Some(ca) => {
            let roots = Arc::new(roots(ca, "--client-ca-file")?);
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| format!("--client-ca-file: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let (certs, key) = identity(&tls.cert_pem, &tls.key_pem, "--cert-file / --key-file")?;
    let mut config =
        builder.with_single_cert(certs, key).map_err(|e| format!("server TLS: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// TLS to etcd for HTTP/1 passed through: etcd's CA and the client identity the gRPC
/// connections use, ALPN `http/1.1`.
pub(crate) fn etcd_connector(tls: &EtcdTls) -> Result<TlsConnector, String> {
    let roots = match &tls.ca_pem {
        Some(ca) => roots(ca, "--etcd-cacert")?,
        None => rustls::RootCertStore::empty(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS to etcd: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &tls.identity_pem {
        Some((cert, key)) => {
            let (certs, key) = identity(cert, key, "--etcd-cert / --etcd-key")?;
            builder.with_client_auth_cert(certs, key).map_err(|e| format!("TLS to etcd: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The certificates of a PEM bundle as trust roots; errors name the flag they came from.
fn roots(pem: &[u8], flag: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        roots.add(c.map_err(|e| format!("{flag}: {e}"))?).map_err(|e| format!("{flag}: {e}"))?;
    }
    Ok(roots)
}

/// A certificate chain and its key from PEM.
fn identity(
    cert: &[u8],
    key: &[u8],
    flags: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flags}: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("{flags}: {e}"))?;
    Ok((certs, key))
}
