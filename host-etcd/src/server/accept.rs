//! The gRPC port's connections, as etcd's client port takes them: every socket without Nagle's
//! algorithm and behind a write batch (`write_batch.rs`); TLS when configured, offering `h2`
//! and `http/1.1` by ALPN as etcd's TLS port does; then HTTP/2 to the gRPC server, and HTTP/1
//! (told by ALPN over TLS, by the first bytes in plain text, `http1.rs`) spliced to etcd.
//!
//! TLS is terminated here rather than by tonic because tonic's offers `h2` alone: a client of
//! etcd's HTTP endpoints over TLS (`curl --cacert ca.pem https://etcd:2379/health`) asks for
//! `http/1.1` too, and must be told apart before HTTP/2 is spoken. When such a client agrees on
//! `h2` instead (curl does by default), its requests are told apart by their content type
//! (`http1::EtcdHttp::request`), as etcd's TLS port does.
//!
//! etcd counterpart: `server/embed/serve.go` (`serveCtx.serve`: `cmux` in plain text; over TLS
//! `tls.NewListener` with the transport's ALPN, then `grpcHandlerFunc` by protocol and content
//! type).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use super::http1::{self, EtcdHttp};
use super::write_batch::WriteBatch;

/// How long a client has for its TLS handshake.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// A connection for the gRPC server.
pub(crate) enum Conn {
    /// Plain text.
    Plain(WriteBatch<TcpStream>),
    /// TLS, terminated here.
    Tls(Box<TlsStream<WriteBatch<TcpStream>>>),
}

pub(crate) type Accepted = Result<Conn, io::Error>;

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a call learns of its connection, in its request's extensions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnInfo {
    /// TLS was terminated here: HTTP/2 that is not gRPC then goes to etcd's HTTP server, as
    /// etcd's TLS port hands it to its HTTP handler (`grpcHandlerFunc`); etcd's plain-text port
    /// gives every HTTP/2 connection to its gRPC server.
    pub tls: bool,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo { tls: matches!(self, Conn::Tls(_)) }
    }
}

/// Accepts clients until the server stops: HTTP/2 to the gRPC server (through `conn_tx`),
/// HTTP/1 spliced to etcd.
pub(crate) async fn accept(
    listener: TcpListener,
    conn_tx: tokio::sync::mpsc::Sender<Accepted>,
    etcd_http: Arc<EtcdHttp>,
    tls: Option<TlsAcceptor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let s = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors or memory (ENFILE, EMFILE, ENOMEM, ENOBUFS on
                    // Linux): the listener is tried again shortly. Anything else concerns one
                    // connection only (reset before it was taken, say): the next is taken at once.
                    if matches!(e.raw_os_error(), Some(23 | 24 | 12 | 105)) {
                        warn!(error = %e, "accepting a gRPC connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = s.set_nodelay(true);
        let (conn_tx, etcd_http, tls, stop) =
            (conn_tx.clone(), etcd_http.clone(), tls.clone(), stop.clone());
        tokio::spawn(async move {
            let conn = match tls {
                None => match http1::sniff_stream(&s).await {
                    http1::Sniffed::Other => return etcd_http.splice(s, stop).await,
                    _ => Conn::Plain(WriteBatch::new(s)),
                },
                Some(acceptor) => {
                    let Some(t) = handshake(&acceptor, s).await else { return };
                    if t.get_ref().1.alpn_protocol() == Some(b"http/1.1".as_slice()) {
                        return etcd_http.splice(t, stop).await;
                    }
                    Conn::Tls(Box::new(t))
                }
            };
            let _ = conn_tx.send(Ok(conn)).await;
        });
    }
}

/// The client's TLS handshake, within [`HANDSHAKE_WAIT`]; `None` (the connection dropped) if it
/// fails.
async fn handshake(
    acceptor: &TlsAcceptor,
    s: TcpStream,
) -> Option<TlsStream<WriteBatch<TcpStream>>> {
    match tokio::time::timeout(HANDSHAKE_WAIT, acceptor.accept(WriteBatch::new(s))).await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(e)) => {
            debug!(error = %e, "TLS handshake with a client");
            None
        }
        Err(_) => None,
    }
}
