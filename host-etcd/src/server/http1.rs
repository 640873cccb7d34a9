//! etcd's HTTP server behind the gRPC port. etcd's client port serves gRPC to its gRPC server
//! and everything else to its HTTP server: the JSON gateway (`/v3/kv/range`, `/v3/watch`, ...),
//! `/health`, `/livez`, `/readyz`, `/version` and `/metrics`. A client of etcd that uses them (a
//! load balancer's health check, `curl` on the gateway) must find them on watchcache's port too,
//! with etcd's own answers.
//!
//! How: each accepted plain-text connection is told apart by its first bytes, as etcd's
//! listener does (`cmux`: HTTP/2's connection preface, or anything else); over TLS by the
//! protocol agreed by ALPN (`accept.rs`). HTTP/2 goes to the gRPC server; anything else is
//! spliced, byte for byte, to an etcd endpoint (over TLS when etcd is reached over TLS), so
//! etcd answers it, streaming gateway watches included. A plain-text connection that sends
//! nothing for [`SNIFF_WAIT`] goes to the gRPC server, as before. Over TLS, HTTP/2 requests
//! that are not gRPC (by content type, as etcd's TLS port tells them) are sent to etcd's HTTP
//! server as HTTP/1.1, one connection each ([`EtcdHttp::request`]): etcd's plain-text port,
//! which watchcache may be using, would hand HTTP/2 to its gRPC server.
//!
//! Auth calls through the gateway (`/v3/auth/enable`, a grant, ...) change what the cache may
//! serve, as they do through gRPC (`forward.rs`): the bytes the client sends etcd are watched
//! for such a path, which makes auth count as on at once, and etcd's state is read again once
//! etcd has answered.
//!
//! etcd counterpart: `server/embed/serve.go` (`serveCtx.serve`: `cmux` with the `HTTP2()`
//! matcher for gRPC and `Any()` for the HTTP mux and the gateway; `grpcHandlerFunc` over TLS).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use crate::server::auth::{auth_call_answered, names_auth_call, AuthChecker, AUTH_PATH};
use crate::upstream::UpstreamConfig;

/// Splices a client's HTTP/1 connection to etcd, as `copy_bidirectional` does, watching the
/// client's bytes for auth calls: one makes auth count as on before etcd sees it, and once
/// etcd's next bytes reach the client (its answer), etcd's state is read again.
async fn splice_watching_auth<C, E>(
    client: C,
    etcd: E,
    auth: &Arc<AuthChecker>,
) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    E: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut etcd_r, mut etcd_w) = tokio::io::split(etcd);
    let answer_pending = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 16 << 10];
        // The last bytes of the previous read: a path cut between two reads is still seen.
        let mut seen: Vec<u8> = Vec::new();
        loop {
            let n = client_r.read(&mut buf).await?;
            if n == 0 {
                return etcd_w.shutdown().await;
            }
            seen.extend_from_slice(&buf[..n]);
            if names_auth_call(&seen) {
                auth.note_auth_change();
                answer_pending.store(true, Ordering::SeqCst);
            }
            seen.drain(..seen.len().saturating_sub(AUTH_PATH.len() - 1));
            etcd_w.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = etcd_r.read(&mut buf).await?;
            if n == 0 {
                return client_w.shutdown().await;
            }
            client_w.write_all(&buf[..n]).await?;
            if answer_pending.swap(false, Ordering::SeqCst) {
                auth_call_answered(auth);
            }
        }
    };
    tokio::try_join!(up, down).map(|_| ())
}

/// HTTP/2's connection preface starts with these bytes (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// How long a new connection may stay silent before it is taken for HTTP/2 (a gRPC client
/// sends its preface at once; so does an HTTP/1 client its request line).
pub(crate) const SNIFF_WAIT: Duration = Duration::from_secs(5);

/// What a connection's first bytes say it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// HTTP/2's preface: the gRPC server's.
    Http2,
    /// Anything else: etcd's HTTP/1 server's.
    Other,
    /// Not enough bytes yet to tell.
    NeedMore,
}

/// Tells HTTP/2 from anything else by the bytes read so far, as `cmux.HTTP2()` does.
pub(crate) fn sniff(first: &[u8]) -> Sniffed {
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] != H2_PREFACE[..n] {
        Sniffed::Other
    } else if n == H2_PREFACE.len() {
        Sniffed::Http2
    } else {
        Sniffed::NeedMore
    }
}

/// Reads (without taking) the first bytes of `s` until they tell; `Http2` after
/// [`SNIFF_WAIT`] of silence or on an error, which the gRPC server then meets itself.
pub(crate) async fn sniff_stream(s: &TcpStream) -> Sniffed {
    let mut buf = [0u8; H2_PREFACE.len()];
    let deadline = tokio::time::Instant::now() + SNIFF_WAIT;
    // A client's first bytes come in one segment: a preface cut short is rare, and is looked
    // at again after growing waits (the socket stays readable while unread bytes are there,
    // so waiting for readiness would not wait).
    let mut wait = Duration::from_millis(1);
    loop {
        let n = match tokio::time::timeout_at(deadline, s.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Sniffed::Http2,
            Ok(Ok(n)) => n,
        };
        match sniff(&buf[..n]) {
            Sniffed::NeedMore => {
                if tokio::time::Instant::now() + wait > deadline {
                    return Sniffed::Http2;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(250));
            }
            told => return told,
        }
    }
}

/// How long reaching an etcd endpoint (TCP, then TLS) may take before the next is tried, as
/// for the gRPC connections to etcd.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// One etcd endpoint: `host:port`, the host alone (TLS's server name), and whether it is
/// reached over TLS.
struct Endpoint {
    addr: String,
    host: String,
    tls: bool,
}

/// Where spliced connections go: etcd's endpoints in turn, each as the gRPC connections reach
/// it (TLS for `https://`, and for a bare `host:port` when TLS to etcd is configured).
pub(crate) struct EtcdHttp {
    endpoints: Vec<Endpoint>,
    tls: Option<tokio_rustls::TlsConnector>,
    next: AtomicUsize,
    /// Told of auth calls passing through.
    auth: Option<Arc<AuthChecker>>,
}

impl EtcdHttp {
    /// From the upstream configuration: the endpoints' URLs as the gRPC connections take them
    /// ([`UpstreamConfig::urls`]).
    pub(crate) fn new(cfg: &UpstreamConfig) -> Result<EtcdHttp, String> {
        let mut endpoints = Vec::new();
        for url in cfg.urls() {
            let uri: http::Uri =
                url.parse().map_err(|e| format!("bad etcd endpoint {url}: {e}"))?;
            let tls = uri.scheme_str().is_some_and(|s| s.eq_ignore_ascii_case("https"));
            let Some(host) = uri.host() else {
                return Err(format!("bad etcd endpoint {url}: no host"));
            };
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            endpoints.push(Endpoint {
                addr: format!("{host}:{port}"),
                host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
                tls,
            });
        }
        let tls = match &cfg.tls {
            Some(t) => Some(super::tls::etcd_connector(t)?),
            None => None,
        };
        Ok(EtcdHttp { endpoints, tls, next: AtomicUsize::new(0), auth: None })
    }

    /// Splices `client` to an etcd endpoint until either side closes, or the server stops (as
    /// etcd's own connections end when it stops). No etcd reached: the client sees its
    /// connection closed, as with etcd down.
    pub(crate) async fn splice<C: AsyncRead + AsyncWrite + Unpin>(
        self: Arc<Self>,
        mut client: C,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        tokio::select! {
            _ = async {
                if let Some(mut etcd) = self.connect().await {
                    let _ = match &self.auth {
                        None => tokio::io::copy_bidirectional(&mut client, &mut etcd).await.map(|_| ()),
                        Some(auth) => splice_watching_auth(client, etcd, auth).await,
                    };
                }
            } => {}
            _ = stop.changed() => {}
        }
    }

    /// Tells `auth` of the auth calls that pass through ([`auth_call_answered`]).
    pub(crate) fn with_auth(mut self, auth: Arc<AuthChecker>) -> EtcdHttp {
        self.auth = Some(auth);
        self
    }

    /// One HTTP/2 request that is not gRPC, from a client over TLS, sent to etcd's HTTP server
    /// as HTTP/1.1 on a connection of its own, and etcd's answer streamed back (a gateway watch
    /// for as long as the client keeps it). Headers that belong to one HTTP/1 connection are
    /// not carried over in either direction (RFC 9113, 8.2.2). etcd not reached: 502.
    pub(crate) async fn request(
        &self,
        req: http::Request<axum::body::Body>,
    ) -> http::Response<axum::body::Body> {
        let Some(io) = self.connect().await else {
            return bad_gateway("no etcd endpoint reached");
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await {
                Ok(x) => x,
                Err(e) => return bad_gateway(&format!("HTTP/1 to etcd: {e}")),
            };
        // The connection lives until the answer is read or dropped.
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "HTTP/1 to etcd for an HTTP/2 request");
            }
        });
        let (mut parts, body) = req.into_parts();
        // HTTP/1.1 names the authority in `Host`, and the path alone in the request line.
        if let Some(host) = parts.uri.authority().and_then(|a| a.as_str().parse().ok()) {
            parts.headers.insert(http::header::HOST, host);
        }
        parts.uri = parts
            .uri
            .path_and_query()
            .map_or(http::Uri::from_static("/"), |p| http::Uri::from(p.clone()));
        parts.version = http::Version::HTTP_11;
        drop_per_connection(&mut parts.headers);
        let auth = self.auth.as_ref().filter(|_| names_auth_call(parts.uri.path().as_bytes()));
        if let Some(a) = auth {
            a.note_auth_change();
        }
        let resp = match sender.send_request(http::Request::from_parts(parts, body)).await {
            Ok(r) => r,
            Err(e) => return bad_gateway(&format!("HTTP/1 to etcd: {e}")),
        };
        if let Some(a) = auth {
            auth_call_answered(a);
        }
        let (mut parts, body) = resp.into_parts();
        drop_per_connection(&mut parts.headers);
        http::Response::from_parts(parts, axum::body::Body::new(body))
    }

    /// A connection to an etcd endpoint, tried in turn from the next one, as the gRPC
    /// connections reach it (over TLS when etcd is reached over TLS).
    async fn connect(&self) -> Option<Box<dyn Io>> {
        let n = self.endpoints.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let ep = &self.endpoints[(first + i) % n];
            let tcp = match tokio::time::timeout(CONNECT_WAIT, TcpStream::connect(&ep.addr)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    debug!(etcd = %ep.addr, error = %e, "HTTP pass-through: etcd not reached");
                    continue;
                }
                Err(_) => {
                    debug!(etcd = %ep.addr, "HTTP pass-through: etcd not reached in time");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            match (&self.tls, ep.tls) {
                (_, false) => return Some(Box::new(tcp)),
                (None, true) => {
                    debug!(etcd = %ep.addr, "HTTP pass-through: https without TLS settings");
                }
                (Some(c), true) => {
                    let Ok(name) = rustls_pki_types::ServerName::try_from(ep.host.clone()) else {
                        continue;
                    };
                    match tokio::time::timeout(CONNECT_WAIT, c.connect(name, tcp)).await {
                        Ok(Ok(t)) => return Some(Box::new(t)),
                        Ok(Err(e)) => {
                            debug!(etcd = %ep.addr, error = %e, "HTTP pass-through: TLS to etcd");
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        None
    }
}

/// A byte stream to etcd's HTTP server: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The layer in front of the gRPC server's routes: over TLS, HTTP/2 that is not gRPC goes to
/// etcd's HTTP server whatever its path, as etcd's TLS port hands it to its HTTP handler.
pub(crate) async fn not_grpc_over_tls(
    axum::extract::State(etcd): axum::extract::State<Arc<EtcdHttp>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> http::Response<axum::body::Body> {
    let tls = req.extensions().get::<super::accept::ConnInfo>().is_some_and(|c| c.tls);
    if tls && !is_grpc(req.headers()) {
        etcd.request(req).await
    } else {
        next.run(req).await
    }
}

/// Whether a request is gRPC, as etcd's `grpcHandlerFunc` tells it: by its content type.
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/grpc"))
}

/// Drops the headers that belong to one HTTP/1 connection, which HTTP/2 does not carry.
fn drop_per_connection(headers: &mut http::HeaderMap) {
    for name in
        ["connection", "transfer-encoding", "upgrade", "te", "keep-alive", "proxy-connection"]
    {
        headers.remove(name);
    }
}

fn bad_gateway(why: &str) -> http::Response<axum::body::Body> {
    debug!(why, "HTTP/2 pass-through to etcd");
    let mut r = http::Response::new(axum::body::Body::from(format!("etcd not reached: {why}\n")));
    *r.status_mut() = http::StatusCode::BAD_GATEWAY;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_is_http2_and_anything_else_is_not() {
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Sniffed::Http2);
        assert_eq!(sniff(b"PRI * HTTP/2.0"), Sniffed::Http2);
        assert_eq!(sniff(b"PRI * HT"), Sniffed::NeedMore);
        assert_eq!(sniff(b""), Sniffed::NeedMore);
        assert_eq!(sniff(b"GET /health HTTP/1.1\r\n"), Sniffed::Other);
        assert_eq!(sniff(b"POST /v3/kv/range HTTP/1.1\r\n"), Sniffed::Other);
        assert_eq!(sniff(b"P"), Sniffed::NeedMore);
        assert_eq!(sniff(b"PO"), Sniffed::Other);
        assert_eq!(sniff(b"\x16\x03\x01"), Sniffed::Other);
    }

    #[test]
    fn endpoints_are_reached_as_the_grpc_connections_reach_them() {
        let parse = |endpoints: &[&str], tls: bool| {
            let cfg = UpstreamConfig {
                endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
                tls: tls.then_some(crate::upstream::EtcdTls { ca_pem: None, identity_pem: None }),
                user: None,
            };
            let h = EtcdHttp::new(&cfg).expect("endpoints");
            h.endpoints.into_iter().map(|e| (e.addr, e.host, e.tls)).collect::<Vec<_>>()
        };
        let s = |a: &str, h: &str, t: bool| (a.to_owned(), h.to_owned(), t);
        assert_eq!(
            parse(&["127.0.0.1:2379", "http://etcd-1:2379/", "https://[::1]:2379"], false),
            vec![
                s("127.0.0.1:2379", "127.0.0.1", false),
                s("etcd-1:2379", "etcd-1", false),
                s("[::1]:2379", "::1", true)
            ]
        );
        // A bare host:port is reached over TLS when TLS to etcd is configured, as gRPC is.
        assert_eq!(
            parse(&["etcd-0:2379", "http://etcd-1:2379"], true),
            vec![s("etcd-0:2379", "etcd-0", true), s("etcd-1:2379", "etcd-1", false)]
        );
    }
}
