//! Test fixtures: a real etcd started by the test on free loopback ports, a `watchcache` server
//! in front of it, clients for both, etcd's own metrics, and the conformance checker.
#![allow(dead_code, missing_docs)]

pub mod conformance;
pub mod http;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use etcd_client::{Client, ConnectOptions};
use host_etcd::{EmbeddedEtcd, EtcdOptions, ServeConfig, Server};

/// A real etcd and a watchcache in front of it.
pub struct Env {
    pub etcd: EmbeddedEtcd,
    pub server: Option<Server>,
    pub cfg: ServeConfig,
}

/// The server configuration the tests use: free ports, prefix `/`, v1.34.
pub fn test_config(etcd: &EmbeddedEtcd) -> ServeConfig {
    let mut cfg = ServeConfig::default();
    cfg.upstream.endpoints = vec![etcd.endpoint()];
    cfg.listen_grpc = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.listen_http = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg
}

/// A fixed window of `capacity` events (no resizing), for the server's caches
/// (`&mut cfg.cache`) or a library cache.
pub fn fixed_window(cfg: &mut host_etcd::CacheConfig, capacity: usize) {
    cfg.core.capacity = capacity;
    cfg.core.lower_bound_capacity = capacity;
    cfg.core.upper_bound_capacity = capacity;
    cfg.core.dynamic_capacity = false;
}

impl Env {
    pub async fn start() -> Env {
        Env::start_with(EtcdOptions::default(), |_| {}).await
    }

    pub async fn start_with(etcd_opts: EtcdOptions, f: impl FnOnce(&mut ServeConfig)) -> Env {
        let etcd =
            EmbeddedEtcd::start(etcd_opts).await.unwrap_or_else(|e| panic!("starting etcd: {e}"));
        let mut cfg = test_config(&etcd);
        f(&mut cfg);
        let server =
            Server::start(cfg.clone()).await.unwrap_or_else(|e| panic!("starting watchcache: {e}"));
        assert!(server.wait_ready(Duration::from_secs(10)).await, "cache not ready");
        Env { etcd, server: Some(server), cfg }
    }

    /// With a fixed window of `capacity` events, so that old start revisions fall outside it.
    pub async fn start_with_window(capacity: usize) -> Env {
        Env::start_with(EtcdOptions::default(), |cfg| fixed_window(&mut cfg.cache, capacity)).await
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("server running")
    }

    pub fn grpc(&self) -> String {
        self.server().grpc_addr().to_string()
    }

    pub fn http(&self) -> String {
        format!("http://{}", self.server().http_addr().expect("http"))
    }

    /// A client of etcd itself.
    pub async fn direct(&self) -> Client {
        connect(&self.etcd.endpoint(), None).await
    }

    /// A client of the cache.
    pub async fn cached(&self) -> Client {
        connect(&self.grpc(), None).await
    }

    /// Waits until every cache has applied revision `rev`.
    pub async fn wait_cache_rev(&self, rev: i64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for c in self.server().caches() {
            while (c.status().rv as i64) < rev {
                assert!(Instant::now() < deadline, "cache stuck at {} < {rev}", c.status().rv);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// etcd's current revision.
    pub async fn etcd_rev(&self) -> i64 {
        let mut c = self.direct().await;
        c.get("\0", None).await.expect("get").header().expect("header").revision()
    }

    /// A series of etcd's own `/metrics` (summed over label sets matching `filter`).
    pub async fn etcd_metric(&self, name: &str, filter: &str) -> f64 {
        metric(&format!("http://{}/metrics", self.etcd.endpoint()), name, filter).await
    }

    /// A series of watchcache's `/metrics`.
    pub async fn cache_metric(&self, name: &str, filter: &str) -> f64 {
        metric(&format!("{}/metrics", self.http()), name, filter).await
    }

    pub async fn stop_server(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

pub async fn connect(endpoint: &str, opts: Option<ConnectOptions>) -> Client {
    let mut last = None;
    for _ in 0..50 {
        match Client::connect([endpoint], opts.clone()).await {
            Ok(c) => return c,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("connecting to {endpoint}: {last:?}");
}

/// Sums the samples of `name` whose label text contains `filter`.
pub async fn metric(url: &str, name: &str, filter: &str) -> f64 {
    let text = http::get(url).await.expect("metrics").text().await.expect("metrics text");
    let mut sum = 0.0;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let metric_name = series.split('{').next().unwrap_or("");
        if metric_name == name && series.contains(filter) {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

/// A raw gRPC channel to `endpoint` (`host:port`), for requests etcd-client cannot make.
pub async fn grpc_channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// A raw gRPC client on `endpoint`, ready: for requests and metadata etcd-client does not
/// send.
pub async fn grpc(endpoint: &str) -> tonic::client::Grpc<tonic::transport::Channel> {
    let mut g = tonic::client::Grpc::new(grpc_channel(endpoint).await);
    g.ready().await.expect("ready");
    g
}

/// A put; its revision.
pub async fn put(client: &mut Client, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> i64 {
    client.put(key, value, None).await.expect("put").header().expect("h").revision()
}

/// A Range over raw gRPC with metadata of the caller's choice (etcd-client sets only `token`):
/// the number of keys, or the refusal's code and message.
pub async fn range_with_metadata(
    endpoint: &str,
    range: etcd_client::proto::PbRangeRequest,
    metadata: Option<(&'static str, String)>,
) -> Result<usize, (tonic::Code, String)> {
    let mut req = tonic::Request::new(range);
    if let Some((name, value)) = metadata {
        req.metadata_mut().insert(name, value.parse().expect("metadata value"));
    }
    match raw_range(endpoint, req).await {
        Ok(r) => Ok(r.kvs.len()),
        Err(s) => Err((s.code(), s.message().to_owned())),
    }
}

/// A Range over raw gRPC: etcd's answer as it came, header and all.
pub async fn raw_range(
    endpoint: &str,
    req: tonic::Request<etcd_client::proto::PbRangeRequest>,
) -> Result<etcd_client::proto::PbRangeResponse, tonic::Status> {
    let path = ::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Range");
    let codec = tonic_prost::ProstCodec::<
        etcd_client::proto::PbRangeRequest,
        etcd_client::proto::PbRangeResponse,
    >::default();
    grpc(endpoint).await.unary(req, path, codec).await.map(|r| r.into_inner())
}

/// Runs etcdctl with the given endpoint and arguments; returns stdout (panics on failure).
pub fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let bin = host_etcd::etcd_launcher::find_binary("etcdctl")
        .expect("etcdctl not found: run make setup-etcd");
    let out = std::process::Command::new(bin)
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .output()
        .expect("running etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Initialises tracing once (RUST_LOG controls it).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// One response of a watch as `fragment_shapes` reads it: its fragment flag, and per event the
/// key, the revision and the size of the previous value.
pub type Shape = (bool, Vec<(String, i64, usize)>);

/// The responses of a watch of `[key, end)` from `rev` with `prev_kv` and `fragment`, on a raw
/// gRPC stream (no client merging fragments), until `events` events have come.
pub async fn fragment_shapes(
    endpoint: &str,
    key: &str,
    end: &str,
    rev: i64,
    events: usize,
) -> Vec<Shape> {
    let mut create = PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    };
    if let Some(PbWatchRequestUnion::CreateRequest(c)) = create.request_union.as_mut() {
        (c.key, c.range_end) = (key.as_bytes().to_vec(), end.as_bytes().to_vec());
        (c.start_revision, c.prev_kv, c.fragment) = (rev, true, true);
    }
    let mut s = RawWatch::open(endpoint, None, create).await;
    let mut shapes = Vec::new();
    let mut seen = 0;
    while seen < events {
        let m = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("in time")
            .expect("a response");
        if m.created {
            continue;
        }
        seen += m.events.len();
        let keys = m
            .events
            .iter()
            .map(|e| {
                let kv = e.kv.clone().unwrap_or_default();
                let prev = e.prev_kv.clone().unwrap_or_default();
                (String::from_utf8_lossy(&kv.key).into_owned(), kv.mod_revision, prev.value.len())
            })
            .collect();
        shapes.push((m.fragment, keys));
    }
    shapes
}

/// A raw Watch stream (no client in between: no merged fragments, no added requests), with
/// the metadata of the caller's choice.
pub struct RawWatch {
    tx: tokio::sync::mpsc::UnboundedSender<PbWatchRequest>,
    rx: tonic::Streaming<PbWatchResponse>,
}

impl RawWatch {
    /// Opens a Watch stream on `endpoint` (`host:port`), with `metadata` (e.g. a token), and
    /// `first` as its first request. That request is queued before the call is made: etcd's
    /// gRPC server sends the response headers, which the call waits for, only with its first
    /// response, so a stream opened empty on etcd would wait forever.
    pub async fn open(
        endpoint: &str,
        metadata: Option<(&'static str, String)>,
        first: PbWatchRequest,
    ) -> RawWatch {
        let (tx, requests) = tokio::sync::mpsc::unbounded_channel();
        tx.send(first).expect("the receiver is ours");
        let mut req =
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(requests));
        if let Some((name, value)) = metadata {
            req.metadata_mut().insert(name, value.parse().expect("metadata value"));
        }
        let codec = tonic_prost::ProstCodec::<PbWatchRequest, PbWatchResponse>::default();
        let path = ::http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        let rx = grpc(endpoint)
            .await
            .max_decoding_message_size(64 << 20)
            .streaming(req, path, codec)
            .await
            .expect("watch stream")
            .into_inner();
        RawWatch { tx, rx }
    }

    /// Sends a request on the stream.
    pub fn send(&self, req: PbWatchRequest) {
        self.tx.send(req).expect("the stream takes requests");
    }

    /// The next response, or the status the stream ended with (`Ok` when it ended without
    /// one).
    pub async fn next(&mut self) -> Result<PbWatchResponse, tonic::Status> {
        match self.rx.message().await {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(tonic::Status::ok("ended without a status")),
            Err(s) => Err(s),
        }
    }
}

/// One HTTP/1.1 request on a new connection, `Connection: close`: the status and the body.
pub async fn http1(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status");
    (status, body.to_owned())
}

/// One HTTP/2 GET (prior knowledge, plain text, no gRPC content type) on a new connection: the
/// status, the `grpc-status` header if any, and the body.
pub async fn h2_get(addr: &str, path: &str) -> (u16, Option<String>, Vec<u8>) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("HTTP/2");
    tokio::spawn(conn);
    let req = ::http::Request::get(format!("http://{addr}{path}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = h2.send_request(req).await.expect("an HTTP/2 answer");
    let status = resp.status().as_u16();
    let grpc = |h: &::http::HeaderMap| {
        h.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_owned)
    };
    let mut grpc_status = grpc(resp.headers());
    let collected = resp.into_body().collect().await.expect("body");
    if grpc_status.is_none() {
        grpc_status = collected.trailers().and_then(grpc);
    }
    (status, grpc_status, collected.to_bytes().to_vec())
}
