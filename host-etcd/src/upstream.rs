//! The connection to etcd: an authenticated `etcd_client::Client` for the cache's own list,
//! watch, progress requests and quorum reads; and a raw gRPC channel that forwards clients'
//! requests with their own metadata (so etcd, not the cache, checks their credentials).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::proto::PbResponseHeader;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status, Streaming};

/// TLS material for the connection to etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// CA certificate (PEM) that signed etcd's server certificate.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

/// How to reach etcd.
#[derive(Clone, Debug, Default)]
pub struct UpstreamConfig {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    /// TLS to etcd, if any.
    pub tls: Option<EtcdTls>,
    /// etcd user and password for the cache's own requests.
    pub user: Option<(String, String)>,
}

/// The connection to etcd.
#[derive(Clone)]
pub struct Upstream {
    /// The cache's own client (authenticated as the configured user).
    pub client: etcd_client::Client,
    channel: Channel,
    header: Arc<Mutex<PbResponseHeader>>,
    /// Whether etcd has auth enabled (so cached reads check the client's permissions).
    pub auth: bool,
}

impl Upstream {
    /// Connects (lazily for the raw channel; the client checks that etcd answers).
    pub async fn connect(cfg: &UpstreamConfig) -> Result<Upstream, String> {
        if cfg.endpoints.is_empty() {
            return Err("no etcd endpoints".into());
        }
        let scheme = if cfg.tls.is_some() { "https" } else { "http" };
        let urls: Vec<String> = cfg
            .endpoints
            .iter()
            .map(|e| if e.contains("://") { e.clone() } else { format!("{scheme}://{e}") })
            .collect();
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let mut tls_cfg = None;
        if let Some(tls) = &cfg.tls {
            let mut t = TlsOptions::new();
            let mut c = ClientTlsConfig::new();
            if let Some(ca) = &tls.ca_pem {
                t = t.ca_certificate(Certificate::from_pem(ca));
                c = c.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &tls.identity_pem {
                t = t.identity(Identity::from_pem(cert, key));
                c = c.identity(Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(t);
            tls_cfg = Some(c);
        }
        if let Some((u, p)) = &cfg.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        let mut client = etcd_client::Client::connect(&urls, Some(opts))
            .await
            .map_err(|e| format!("connecting to etcd at {}: {e}", urls.join(",")))?;
        let mut endpoints = Vec::new();
        for u in &urls {
            let mut ep = Endpoint::from_shared(u.clone())
                .map_err(|e| format!("bad etcd endpoint {u}: {e}"))?
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true);
            if let Some(c) = &tls_cfg {
                ep = ep.tls_config(c.clone()).map_err(|e| format!("etcd TLS: {e}"))?;
            }
            endpoints.push(ep);
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        let status = client.status().await.map_err(|e| format!("etcd status: {e}"))?;
        let mut header = PbResponseHeader::default();
        if let Some(h) = status.header() {
            header.cluster_id = h.cluster_id();
            header.member_id = h.member_id();
            header.raft_term = h.raft_term();
            header.revision = h.revision();
        }
        Ok(Upstream {
            client,
            channel,
            header: Arc::new(Mutex::new(header)),
            auth: cfg.user.is_some(),
        })
    }

    /// A response header for `revision` with etcd's cluster and member ids.
    pub fn header(&self, revision: i64) -> PbResponseHeader {
        let h = self.header.lock().map(|h| *h).unwrap_or_default();
        PbResponseHeader { revision, ..h }
    }

    /// Remembers etcd's ids and term from a header it sent.
    pub fn note_header(&self, cluster_id: u64, member_id: u64, raft_term: u64) {
        if let Ok(mut h) = self.header.lock() {
            h.cluster_id = cluster_id;
            h.member_id = member_id;
            h.raft_term = raft_term;
        }
    }

    /// etcd's current revision, by a linearizable count-only read of `prefix` (a quorum read,
    /// as Kubernetes' `GetCurrentResourceVersionFromStorage`).
    pub async fn current_revision(&self, prefix: &[u8]) -> Result<u64, String> {
        let mut kv = self.client.kv_client();
        let (key, end) = crate::reflector::prefix_range(prefix);
        let opts = etcd_client::GetOptions::new().with_range(end).with_count_only().with_limit(1);
        let resp = kv.get(key, Some(opts)).await.map_err(|e| e.to_string())?;
        let h = resp.header().ok_or("no header in etcd's answer")?;
        self.note_header(h.cluster_id(), h.member_id(), h.raft_term());
        Ok(h.revision().max(0) as u64)
    }

    /// The raw channel (for the transparent forwarder).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Forwards a unary call to etcd with the client's metadata.
    pub async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        metadata: &MetadataMap,
        message: Req,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| Status::unavailable(format!("etcd unavailable: {e}")))?;
        let req = with_metadata(metadata, message);
        grpc.unary(req, PathAndQuery::from_static(path), tonic_prost::ProstCodec::default()).await
    }

    /// Opens a bidirectional stream to etcd with the client's metadata, sending `first` at
    /// once (etcd answers the stream's headers only with its first response).
    pub async fn streaming<Req, Resp>(
        &self,
        path: &'static str,
        metadata: &MetadataMap,
        capacity: usize,
        first: Req,
    ) -> Result<(mpsc::Sender<Req>, Streaming<Resp>), Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        tx.try_send(first).map_err(|_| Status::internal("stream buffer"))?;
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| Status::unavailable(format!("etcd unavailable: {e}")))?;
        let req = with_metadata(metadata, ReceiverStream::new(rx));
        let resp = grpc
            .streaming(req, PathAndQuery::from_static(path), tonic_prost::ProstCodec::default())
            .await?;
        Ok((tx, resp.into_inner()))
    }
}

/// Metadata a client sent that etcd needs to see (its token, require-leader, ...), without
/// the transport's own headers.
pub fn forwardable(md: &MetadataMap) -> MetadataMap {
    let mut out = MetadataMap::new();
    for kv in md.iter() {
        if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
            let name = k.as_str();
            if name.starts_with("grpc-")
                || matches!(name, "te" | "content-type" | "user-agent" | "host" | "content-length")
            {
                continue;
            }
            out.append(k.clone(), v.clone());
        }
    }
    out
}

fn with_metadata<T>(md: &MetadataMap, message: T) -> Request<T> {
    let mut req = Request::new(message);
    *req.metadata_mut() = forwardable(md);
    req
}
