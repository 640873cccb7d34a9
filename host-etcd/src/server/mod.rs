//! The `watchcache` server: one cache task and one reflector per prefix, the etcd gRPC API
//! (Watch and Range from the caches, everything else forwarded), and the HTTP API; started
//! together, stopped together. Nothing below (`cache`, `session`, `library`) imports from here.
//!
//! | module | what it owns | counterpart |
//! |---|---|---|
//! | `watch` | etcd `Watch` streams: the wire side of a watch session | etcd `v3rpc/watch.go` |
//! | `kv` | etcd `Range` and `RangeStream` from the cache, `Compact` | etcd `v3rpc/key.go`, `txn/range.go`, `v3_server.go` |
//! | `forward` | every other call, passed through to etcd | the gRPC proxy's per-service forwarding |
//! | `accept` | the gRPC port's connections: TLS with etcd's ALPN, HTTP/2 to the gRPC server, HTTP/1 to `http1` | etcd `embed/serve.go` |
//! | `http1` | what is not gRPC on the gRPC port (etcd's JSON gateway, `/health`, `/version`): HTTP/1 spliced to etcd, HTTP/2 over TLS sent to it as HTTP/1.1 | etcd `embed/serve.go` (`cmux`, `grpcHandlerFunc`) |
//! | `tls` | TLS configurations: the port's (etcd's ALPN, client certificates) and to etcd for `http1` | etcd `client/pkg/transport/listener.go` |
//! | `auth` | what a client may read, decided by etcd, cached briefly | etcd `auth/store.go`, `isWatchPermitted` |
//! | `http_api` | `/metrics`, `/healthz`, `/readyz`, `/debug/state`, Kubernetes-style list/watch | apiserver `endpoints/handlers` |
//! | `prometheus` | the metrics as Prometheus text | `storage/cacher/metrics/metrics.go` |
//! | `wire` | etcd's protobuf on the wire: events encoded once per revision, framed per watcher | etcd `mvccpb`, `etcdserverpb` |
//! | `write_batch` | a gRPC connection's writes, gathered into one per scheduler round | grpc-go's `loopyWriter` and buffered framer |
//!
//! Kubernetes counterpart: how kube-apiserver wires one `Cacher` per resource in front of the
//! etcd3 store (`storage/cacher/cacher.go` `NewCacherFromConfig`, the storage factory).

mod accept;
pub mod auth;
mod forward;
mod http1;
mod http_api;
mod kv;
pub mod prometheus;
mod tls;
mod watch;
pub mod wire;
mod write_batch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cacher_core::KeyRange;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::cache::CacheHandle;
use crate::clock::Clock;
use crate::config::CacheConfig;
use crate::library::{session_config, spawn_cache};
use crate::metrics::HostMetrics;
use crate::session::driver::SessionEnv;
use crate::upstream::{Upstream, UpstreamConfig};
use auth::{AuthChecker, AuthPermissions};

/// TLS for the server's own gRPC clients.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// Server certificate (PEM).
    pub cert_pem: Vec<u8>,
    /// Server key (PEM).
    pub key_pem: Vec<u8>,
    /// When set, only clients with a certificate signed by this CA (PEM) connect.
    pub client_ca_pem: Option<Vec<u8>>,
}

/// Everything `watchcache serve` is configured with.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The etcd to cache.
    pub upstream: UpstreamConfig,
    /// Cached prefixes (one cache each).
    pub prefixes: Vec<Vec<u8>>,
    /// Each cache's configuration (the core's, the flow to watchers, the reflector, the
    /// watch sessions).
    pub cache: CacheConfig,
    /// gRPC listen address (port 0 picks a free one).
    pub listen_grpc: SocketAddr,
    /// HTTP listen address, if HTTP is served.
    pub listen_http: Option<SocketAddr>,
    /// TLS for gRPC clients.
    pub tls: Option<ServerTls>,
    /// How long a permission decision is reused.
    pub auth_cache_ttl: Duration,
    /// The web demo's files, served over HTTP when the directory exists.
    pub web_dir: Option<PathBuf>,
    /// How long [`Server::start`] waits for etcd to answer before it gives up (`None`: as
    /// long as it takes; see [`Upstream::connect_waiting`]).
    pub etcd_start_timeout: Option<Duration>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            upstream: UpstreamConfig::default(),
            prefixes: vec![b"/".to_vec()],
            cache: CacheConfig::default(),
            listen_grpc: SocketAddr::from(([127, 0, 0, 1], 2479)),
            listen_http: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            tls: None,
            auth_cache_ttl: Duration::from_secs(5),
            web_dir: None,
            etcd_start_timeout: None,
        }
    }
}

/// What request handlers share.
pub(crate) struct Ctx {
    /// The caches, the connection to etcd, the counters: what watch sessions share too.
    pub env: Arc<SessionEnv>,
    pub auth: Arc<AuthChecker>,
    /// etcd's `--max-request-bytes`: what RangeStream's chunks aim at, and (with gRPC's
    /// overhead) the largest request read.
    pub max_request_bytes: usize,
}

impl Ctx {
    /// etcd's limit on a request message (`MaxRecvMsgSize`): the requests read here (the
    /// Watch stream's, Compact's) are held to it with etcd's refusal ([`wire::ReceiveLimit`]);
    /// a larger Range passes through, for etcd's own.
    pub fn etcd_receive_limit(&self) -> usize {
        self.max_request_bytes.saturating_add(wire::GRPC_OVERHEAD_BYTES)
    }

    pub fn caches(&self) -> &[CacheHandle] {
        &self.env.caches
    }

    pub fn upstream(&self) -> &Upstream {
        &self.env.upstream
    }

    pub fn metrics(&self) -> &HostMetrics {
        &self.env.metrics
    }

    /// The cache whose prefix holds every key of `range` (the longest such prefix).
    pub fn cache_for(&self, range: &KeyRange) -> Option<usize> {
        self.caches()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.covers(range))
            .max_by_key(|(_, c)| c.prefix().len())
            .map(|(i, _)| i)
    }

    /// etcd's compaction revision, as far as the caches know.
    pub fn compacted(&self) -> u64 {
        self.caches().iter().map(|c| c.status().compacted).max().unwrap_or(0)
    }

    /// etcd compacted at `rev`: reads and watches below it go to etcd (which refuses them as
    /// etcd does), and the caches drop their older snapshots.
    pub fn note_compacted(&self, rev: u64) {
        for c in self.caches() {
            c.note_compacted(rev);
        }
    }
}

/// A running server.
pub struct Server {
    ctx: Arc<Ctx>,
    grpc_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    /// Connects to etcd, starts a cache and reflector per prefix, and serves gRPC and HTTP.
    pub async fn start(cfg: ServeConfig) -> Result<Server, String> {
        if cfg.prefixes.is_empty() {
            return Err("at least one --prefix is needed".into());
        }
        cfg.cache.validate()?;
        let upstream = Upstream::connect_waiting(&cfg.upstream, cfg.etcd_start_timeout).await?;
        let metrics = Arc::new(HostMetrics::default());
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let clock = Clock::new();
        let cache_config = Arc::new(cfg.cache.clone());
        let mut caches = Vec::new();
        let mut tasks = Vec::new();
        for prefix in &cfg.prefixes {
            let spawned = spawn_cache(
                prefix,
                cache_config.clone(),
                clock,
                &upstream,
                &metrics,
                shutdown_rx.clone(),
            )?;
            tasks.extend(spawned.tasks);
            caches.push(spawned.handle);
        }
        let auth =
            Arc::new(AuthChecker::new(upstream.clone(), cfg.auth_cache_ttl, metrics.clone()));
        auth.refresh().await;
        let env = Arc::new(SessionEnv {
            caches,
            upstream,
            metrics,
            permissions: Some(Arc::new(AuthPermissions(auth.clone()))),
            clock,
            config: session_config(&cfg.cache, true),
            shutdown: shutdown_rx.clone(),
        });
        let ctx = Arc::new(Ctx { env, auth, max_request_bytes: cfg.cache.max_request_bytes });
        {
            let ctx = ctx.clone();
            let mut stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(10)) => ctx.auth.refresh().await,
                        _ = stop.changed() => return,
                    }
                }
            }));
        }

        // gRPC: Watch, Range and Compact handled here; every other call forwarded to etcd.
        let grpc_listener = TcpListener::bind(cfg.listen_grpc)
            .await
            .map_err(|e| format!("listening for gRPC on {}: {e}", cfg.listen_grpc))?;
        let grpc_addr = grpc_listener.local_addr().map_err(|e| e.to_string())?;
        // etcd's HTTP server, for what is not gRPC (`http1.rs`).
        let etcd_http = Arc::new(http1::EtcdHttp::new(&cfg.upstream)?.with_auth(ctx.auth.clone()));
        let router = {
            let (c1, c2, c3, c4) = (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());
            axum::Router::new()
                .route(
                    "/etcdserverpb.Watch/Watch",
                    axum::routing::any(move |req: http::Request<axum::body::Body>| {
                        watch::route(c1.clone(), req)
                    }),
                )
                .route(
                    "/etcdserverpb.KV/Range",
                    axum::routing::any(move |req: http::Request<axum::body::Body>| {
                        kv::range_route(c2.clone(), req)
                    }),
                )
                .route(
                    "/etcdserverpb.KV/RangeStream",
                    axum::routing::any({
                        let c = ctx.clone();
                        move |req: http::Request<axum::body::Body>| {
                            kv::range_stream_route(c.clone(), req)
                        }
                    }),
                )
                .route(
                    "/etcdserverpb.KV/Compact",
                    axum::routing::any(move |req: http::Request<axum::body::Body>| {
                        kv::compact_route(c3.clone(), req)
                    }),
                )
                .fallback(move |req: http::Request<axum::body::Body>| {
                    forward::forward(c4.clone(), req)
                })
                .layer(axum::middleware::from_fn_with_state(
                    etcd_http.clone(),
                    http1::not_grpc_over_tls,
                ))
        };
        let mut builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .initial_connection_window_size(Some(16 << 20))
            .initial_stream_window_size(Some(4 << 20))
            // grpc-go's (etcd's) limit on a request's headers, where hyper's is 16 KiB.
            .http2_max_header_list_size(Some(16 << 20));
        let routes = tonic::service::Routes::from(router);
        let mut stop = shutdown_rx.clone();
        // Every accepted socket without Nagle's algorithm: tonic's `tcp_nodelay` applies only
        // to listeners it binds itself, and small responses (a watch's `created`, a unary
        // answer) would otherwise wait for the client's delayed ACK (about 40 ms).
        // Each connection's writes are gathered per scheduler round (`write_batch.rs`): one
        // revision's responses to all of a connection's streams leave in one write.
        // TLS (terminated in `accept.rs`, with etcd's ALPN); connections that are not HTTP/2 are
        // etcd's HTTP/1 clients (`http1.rs`).
        let tls = cfg.tls.as_ref().map(tls::acceptor).transpose()?;
        let (conn_tx, conn_rx) = tokio::sync::mpsc::channel(64);
        tasks.push(tokio::spawn(accept::accept(
            grpc_listener,
            conn_tx,
            etcd_http,
            tls,
            shutdown_rx.clone(),
        )));
        let incoming = tokio_stream::wrappers::ReceiverStream::new(conn_rx);
        let serve = builder.add_routes(routes).serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.changed().await;
        });
        tasks.push(tokio::spawn(async move {
            if let Err(e) = serve.await {
                warn!(error = %e, "gRPC server ended");
            }
        }));

        let mut http_addr = None;
        if let Some(addr) = cfg.listen_http {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("listening for HTTP on {addr}: {e}"))?;
            http_addr = Some(l.local_addr().map_err(|e| e.to_string())?);
            let app = http_api::router(ctx.clone(), cfg.web_dir.clone());
            let mut stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                // Without Nagle's algorithm, as for gRPC.
                let l = axum::serve::ListenerExt::tap_io(l, |tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                let r = axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.changed().await;
                    })
                    .await;
                if let Err(e) = r {
                    warn!(error = %e, "HTTP server ended");
                }
            }));
        }
        info!(grpc = %grpc_addr, http = ?http_addr, prefixes = ?cfg.prefixes.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>(), "watchcache serving");
        Ok(Server { ctx, grpc_addr, http_addr, shutdown: shutdown_tx, tasks })
    }

    /// The gRPC address clients connect to.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The HTTP address, if HTTP is served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The caches, one per prefix.
    pub fn caches(&self) -> &[CacheHandle] {
        self.ctx.caches()
    }

    /// The host's counters.
    pub fn metrics(&self) -> &HostMetrics {
        self.ctx.metrics()
    }

    /// Waits until every cache is ready (at most `limit`).
    pub async fn wait_ready(&self, limit: Duration) -> bool {
        for c in self.ctx.caches() {
            if !c.wait_ready(limit).await {
                return false;
            }
        }
        true
    }

    /// Stops serving: open watch streams end with `Unavailable`, the reflectors stop, the
    /// caches stop.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let Server { ctx, tasks, .. } = self;
        drop(ctx);
        for t in tasks {
            if tokio::time::timeout(Duration::from_secs(5), t).await.is_err() {
                warn!("a task did not stop within 5 s");
            }
        }
    }
}
