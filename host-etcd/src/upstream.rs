//! The connection to etcd: an authenticated `etcd_client::Client` for the cache's own list,
//! watch, progress requests and quorum reads; and, in the server, a raw gRPC channel that
//! forwards clients' requests with their own metadata (so etcd, not the cache, checks their
//! credentials). A library cache built from an existing `etcd_client::Client` has no raw
//! channel: its watches that etcd must serve go through that client.
//!
//! Connections: the client's own (lists, quorum reads, probes); one for the reflectors' watches;
//! one for calls passed through; one for relayed watches. None of them shares HTTP/2's
//! connection-level flow control with another, and the last three have connection windows as
//! large as HTTP/2 allows, so that a client that stops reading holds up only its own streams
//! (as on etcd, where each client has its own connection): a stalled relayed watch keeps at
//! most its stream window ([`RELAY_STREAM_WINDOW`]) unread, and never the others' answers.
//!
//! The cache's own watches go through a client that sets etcd's require-leader flag
//! (`hasleader`, clientv3's `WithRequireLeader`): the etcd member ends them with
//! `etcdserver: no leader` once it has had no leader for three election timeouts
//! (`v3rpc/interceptor.go`, `monitorLeader`), and refuses them while it has none. The reflector
//! notes that here ([`Upstream::no_leader`]), and the server answers its own clients'
//! require-leader streams and cached reads as that member would.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::proto::{PbResponseHeader, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use http::uri::PathAndQuery;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use crate::config::MAX_RECEIVE_BYTES;

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

impl UpstreamConfig {
    /// Each endpoint as a URL: as given when it has a scheme, else `https://` when TLS to etcd
    /// is configured and `http://` when not.
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| if e.contains("://") { e.clone() } else { format!("{scheme}://{e}") })
            .collect()
    }
}

/// Why connecting to etcd failed, and whether it may work later.
struct ConnectFailure {
    message: String,
    /// etcd did not answer (a refused or broken connection, etcd starting or without a
    /// leader), rather than refused what it was asked or the configuration being wrong.
    unreachable: bool,
}

impl ConnectFailure {
    fn fatal(message: String) -> ConnectFailure {
        ConnectFailure { message, unreachable: false }
    }

    fn of(what: String, e: etcd_client::Error) -> ConnectFailure {
        // A certificate etcd or watchcache refuses is configuration, whatever the error's kind.
        let certificate = format!("{e:?}").to_ascii_lowercase().contains("certificate");
        let unreachable = !certificate
            && match &e {
                etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
                etcd_client::Error::GRpcStatus(s) => matches!(
                    s.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
                ),
                _ => false,
            };
        ConnectFailure { message: format!("{what}: {e}"), unreachable }
    }
}

/// The connection to etcd.
#[derive(Clone)]
pub struct Upstream {
    /// The cache's own client (authenticated as the configured user).
    pub client: etcd_client::Client,
    /// Calls passed through.
    channel: Option<Channel>,
    /// Relayed watches.
    relays: Option<Channel>,
    header: Arc<Mutex<PbResponseHeader>>,
    /// etcd's voting members as last read (0: not known yet); see [`Upstream::single_member`].
    voting_members: Arc<AtomicU32>,
    /// The client for the cache's own watches: etcd's require-leader flag set, on a connection
    /// of its own (`client` itself in a library cache).
    watcher: etcd_client::Client,
    /// etcd ended or refused the cache's require-leader watch for want of a leader, and no
    /// watch has been created since.
    no_leader: Arc<watch::Sender<bool>>,
    /// The cache's own user and password, for [`Upstream::own_token`].
    credentials: Option<(String, String)>,
    /// The token relays of watches etcd already permitted are opened with.
    own_token: Arc<tokio::sync::Mutex<Option<String>>>,
    /// How many times a cache's watch or list on etcd broke (etcd restarted or was out of
    /// reach); see [`Upstream::outages`].
    outages: Arc<AtomicU64>,
}

/// Whether a call carries etcd's require-leader flag (`hasleader: true`, clientv3's
/// `WithRequireLeader`; kube-apiserver sets it on its watches).
pub fn requires_leader(md: &MetadataMap) -> bool {
    md.get(REQUIRE_LEADER_KEY).is_some_and(|v| v == "true")
}

/// etcd's answer to a require-leader call on a member with no leader (`ErrGRPCNoLeader`).
pub fn no_leader_status() -> Status {
    Status::unavailable(NO_LEADER)
}

/// The largest HTTP/2 window (2^31 - 1): the raw channels' connection windows, so that only
/// stream windows hold a sender back.
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The stream window of a relayed watch: what etcd may send it that it has not read yet (its
/// client has stopped reading); etcd holds the rest back, as it would for that client.
pub const RELAY_STREAM_WINDOW: u32 = 256 << 10;

/// etcd's metadata key for the require-leader flag (`rpctypes.MetadataRequireLeaderKey`).
const REQUIRE_LEADER_KEY: &str = "hasleader";

/// etcd's message for `ErrGRPCNoLeader`.
pub(crate) const NO_LEADER: &str = "etcdserver: no leader";

impl Upstream {
    /// The client for the cache's own watches (see the module's comment).
    pub(crate) fn watcher(&self) -> &etcd_client::Client {
        &self.watcher
    }

    /// Whether the cache authenticates to etcd as a user of its own.
    pub(crate) fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// A token of the cache's own user, for the relays of watches etcd already permitted (see
    /// `session::driver::open_relay_watch`): one Authenticate, then the same token until etcd
    /// refuses it (`refused`: that token), when it authenticates again (unless another relay
    /// already did). `None` without credentials, or when etcd has auth turned off (it then
    /// refuses to authenticate, and reads no token).
    pub(crate) async fn own_token(&self, refused: Option<&str>) -> Result<Option<String>, Status> {
        let Some((user, password)) = &self.credentials else { return Ok(None) };
        let mut token = self.own_token.lock().await;
        match token.as_deref() {
            Some(t) if refused != Some(t) => return Ok(Some(t.to_owned())),
            _ => {}
        }
        let r = self.client.auth_client().authenticate(user.clone(), password.clone()).await;
        match r {
            Ok(r) => {
                *token = Some(r.token().to_owned());
                Ok(Some(r.token().to_owned()))
            }
            Err(etcd_client::Error::GRpcStatus(s))
                if s.message().contains("authentication is not enabled") =>
            {
                *token = None;
                Ok(None)
            }
            Err(etcd_client::Error::GRpcStatus(s)) => Err(s),
            Err(other) => Err(Status::unavailable(other.to_string())),
        }
    }

    /// Authenticates the cache's own clients again, after etcd refused their token
    /// ([`is_token_refusal`]) for a watch: an unused simple token expires after etcd's
    /// `--auth-token-ttl`, and a restart forgets it, while the cache's upstream watch, created
    /// once, uses it only when it is created again. A no-op without credentials.
    pub(crate) async fn refresh_tokens(&self) {
        if !self.has_credentials() {
            return;
        }
        for c in [&self.client, &self.watcher] {
            if let Err(e) = c.refresh_token().await {
                tracing::warn!(error = %e, "authenticating to etcd again failed");
            }
        }
    }

    /// Whether etcd has said that its member has no leader (it ended or refused the cache's
    /// require-leader watch), with no watch created since.
    pub fn no_leader(&self) -> bool {
        *self.no_leader.borrow()
    }

    /// The reflector's finding: etcd ended or refused its watch for want of a leader (`true`),
    /// or created one (`false`).
    pub(crate) fn set_no_leader(&self, lost: bool) {
        self.no_leader.send_if_modified(|v| std::mem::replace(v, lost) != lost);
    }

    /// [`Upstream::no_leader`] and its changes.
    pub(crate) fn watch_no_leader(&self) -> watch::Receiver<bool> {
        self.no_leader.subscribe()
    }

    /// Connects (lazily for the raw channel; the client checks that etcd answers).
    pub async fn connect(cfg: &UpstreamConfig) -> Result<Upstream, String> {
        Upstream::try_connect(cfg).await.map_err(|f| f.message)
    }

    /// Connects as [`Upstream::connect`] does, trying again while etcd cannot be reached (a
    /// refused connection, etcd starting or without a leader), for at most `wait` (`None`:
    /// until it answers), with a warning per attempt: a cache started beside etcd, or during
    /// an outage, comes up with it instead of exiting. Any other failure (a bad endpoint, TLS
    /// material, refused credentials) ends it at once.
    pub async fn connect_waiting(
        cfg: &UpstreamConfig,
        wait: Option<Duration>,
    ) -> Result<Upstream, String> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let failure = match Upstream::try_connect(cfg).await {
                Ok(u) => return Ok(u),
                Err(f) => f,
            };
            let waited = started.elapsed();
            if !failure.unreachable || wait.is_some_and(|w| waited + pause > w) {
                return Err(failure.message);
            }
            tracing::warn!(
                error = %failure.message,
                waited_ms = waited.as_millis() as u64,
                "etcd cannot be reached yet; trying again in {} ms",
                pause.as_millis()
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    async fn try_connect(cfg: &UpstreamConfig) -> Result<Upstream, ConnectFailure> {
        if cfg.endpoints.is_empty() {
            return Err(ConnectFailure::fatal("no etcd endpoints".into()));
        }
        let urls = cfg.urls();
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
            // etcd forgets a token unused for `--auth-token-ttl` (5 min) or lost in a restart:
            // a unary call refused for it authenticates again and is retried, as clientv3's
            // are (its watches, which etcd refuses by a cancel, see `refresh_tokens`).
            opts = opts.with_user(u.clone(), p.clone()).with_auto_token_refresh(true);
        }
        let mut client =
            etcd_client::Client::connect(&urls, Some(opts.clone())).await.map_err(|e| {
                ConnectFailure::of(format!("connecting to etcd at {}", urls.join(",")), e)
            })?;
        let mut endpoints = Vec::new();
        for u in &urls {
            let mut ep = Endpoint::from_shared(u.clone())
                .map_err(|e| ConnectFailure::fatal(format!("bad etcd endpoint {u}: {e}")))?
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true)
                .initial_connection_window_size(MAX_WINDOW);
            if let Some(c) = &tls_cfg {
                ep = ep
                    .tls_config(c.clone())
                    .map_err(|e| ConnectFailure::fatal(format!("etcd TLS: {e}")))?;
            }
            endpoints.push(ep);
        }
        let relays = Channel::balance_list(
            endpoints.iter().map(|e| e.clone().initial_stream_window_size(RELAY_STREAM_WINDOW)),
        );
        // The caches' watches: each reflector stops reading while its cache is behind, so
        // the connection window must not let one hold up the others either.
        let watches = Channel::balance_list(endpoints.iter().cloned());
        let channel = Channel::balance_list(endpoints.into_iter());
        let watcher = etcd_client::Client::from_channel(
            etcd_client::Channel::Tonic(watches),
            Some(opts.with_require_leader(true)),
        )
        .await
        .map_err(|e| ConnectFailure::of(format!("connecting to etcd at {}", urls.join(",")), e))?;
        let status =
            client.status().await.map_err(|e| ConnectFailure::of("etcd status".into(), e))?;
        let mut header = PbResponseHeader::default();
        if let Some(h) = status.header() {
            header.cluster_id = h.cluster_id();
            header.member_id = h.member_id();
            header.raft_term = h.raft_term();
            header.revision = h.revision();
        }
        Ok(Upstream {
            client,
            channel: Some(channel),
            relays: Some(relays),
            header: Arc::new(Mutex::new(header)),
            voting_members: Arc::default(),
            watcher,
            no_leader: Arc::new(watch::channel(false).0),
            credentials: cfg.user.clone(),
            own_token: Arc::default(),
            outages: Arc::default(),
        })
    }

    /// Wraps an existing client (a library cache): no raw channel, so no forwarding of other
    /// clients' calls; etcd's cluster and member ids come from a status call.
    pub async fn from_client(mut client: etcd_client::Client) -> Result<Upstream, String> {
        let status = client.status().await.map_err(|e| format!("etcd status: {e}"))?;
        let mut header = PbResponseHeader::default();
        if let Some(h) = status.header() {
            header.cluster_id = h.cluster_id();
            header.member_id = h.member_id();
            header.raft_term = h.raft_term();
            header.revision = h.revision();
        }
        Ok(Upstream {
            watcher: client.clone(),
            client,
            channel: None,
            relays: None,
            header: Arc::new(Mutex::new(header)),
            voting_members: Arc::default(),
            no_leader: Arc::new(watch::channel(false).0),
            credentials: None,
            own_token: Arc::default(),
            outages: Arc::default(),
        })
    }

    /// A cache's watch or list on etcd broke.
    pub(crate) fn note_outage(&self) {
        self.outages.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times a cache's watch or list on etcd has broken so far. A client stream
    /// opened before the count moved would have been broken by etcd itself if etcd restarted
    /// (the session uses that to read a forgotten token).
    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Opens a watch on etcd for `create` (a create request), with the client's metadata when
    /// forwarding, or through the cache's own client in a library cache.
    pub(crate) async fn open_watch(
        &self,
        metadata: &MetadataMap,
        create: PbWatchRequest,
    ) -> Result<(UpWatchTx, UpWatchRx), Status> {
        if self.relays.is_some() {
            let (tx, rx) = self.relay_watch(metadata, 16, create).await?;
            return Ok((UpWatchTx::Raw(tx), UpWatchRx::Raw(rx)));
        }
        let Some(PbWatchRequestUnion::CreateRequest(c)) = create.request_union else {
            return Err(Status::invalid_argument("not a create request"));
        };
        let mut o = etcd_client::WatchOptions::new().with_start_revision(c.start_revision);
        if !c.range_end.is_empty() {
            o = o.with_range(c.range_end.clone());
        }
        if c.prev_kv {
            o = o.with_prev_key();
        }
        if c.progress_notify {
            o = o.with_progress_notify();
        }
        if c.fragment {
            o = o.with_fragment();
        }
        let filters: Vec<etcd_client::WatchFilterType> = c
            .filters
            .iter()
            .filter_map(|f| match *f {
                0 => Some(etcd_client::WatchFilterType::NoPut),
                1 => Some(etcd_client::WatchFilterType::NoDelete),
                _ => None,
            })
            .collect();
        if !filters.is_empty() {
            o = o.with_filters(filters);
        }
        let stream = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_RECEIVE_BYTES)
            .watch(c.key.clone(), Some(o))
            .await
            .map_err(|e| match e {
                etcd_client::Error::GRpcStatus(s) => s,
                other => Status::unavailable(other.to_string()),
            })?;
        let (tx, rx) = stream.split();
        Ok((UpWatchTx::Client(tx), UpWatchRx::Client(rx)))
    }

    /// Whether relayed watches share their HTTP/2 connection with other calls (a library cache
    /// built on its user's client); the server gives them a connection of their own.
    pub(crate) fn relays_share_a_connection(&self) -> bool {
        self.relays.is_none()
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

    /// Whether etcd is known to be a cluster of one voting member. Then the revision that
    /// member reports at any moment covers every write it has acknowledged (a write is
    /// acknowledged after it is applied), so the revision in a watch's `created` answer is as
    /// fresh as a quorum read's; with several members it is not (a follower can lag).
    pub fn single_member(&self) -> bool {
        self.voting_members.load(Ordering::Relaxed) == 1
    }

    /// Reads etcd's member list (no Range, no raft round) and remembers how many voting
    /// members it has; unknown (so not single) when etcd does not answer.
    pub async fn refresh_members(&self) -> Result<u32, String> {
        let mut cluster = self.client.cluster_client();
        let res = cluster.member_list().await.map_err(|e| e.to_string());
        let n = match &res {
            Ok(r) => r.members().iter().filter(|m| !m.is_learner()).count() as u32,
            Err(_) => 0,
        };
        self.voting_members.store(n, Ordering::Relaxed);
        res.map(|_| n)
    }

    /// etcd's current revision, by a linearizable read of one key (a quorum read, as
    /// Kubernetes' `GetCurrentResourceVersionFromStorage`, at constant cost).
    pub async fn current_revision(&self, prefix: &[u8]) -> Result<u64, String> {
        let mut kv = self.client.kv_client();
        // One key (the prefix itself, inside the range the cache may read): the header
        // revision is the store's, and the read costs etcd the same whatever the store holds.
        let key = crate::keys::probe_key(prefix);
        let opts = etcd_client::GetOptions::new().with_count_only();
        let resp = kv.get(key, Some(opts)).await.map_err(|e| e.to_string())?;
        let h = resp.header().ok_or("no header in etcd's answer")?;
        self.note_header(h.cluster_id(), h.member_id(), h.raft_term());
        Ok(h.revision().max(0) as u64)
    }

    /// etcd's compaction revision if it is above `below`, from the cancel of a watch of one key
    /// that starts at `below` (etcd names it in `compact_revision`); `below` otherwise. Cheap
    /// when compacted: etcd cancels such a watch before reading any history.
    pub async fn compaction_revision(&self, key: &[u8], below: u64) -> Result<u64, String> {
        let key = crate::keys::probe_key(key);
        let mut client = self.client.watch_client();
        let opts = etcd_client::WatchOptions::new().with_start_revision(below as i64);
        let mut stream = client.watch(key, Some(opts)).await.map_err(|e| e.to_string())?;
        loop {
            let resp = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .map_err(|_| "etcd did not answer a watch".to_owned())?
                .map_err(|e| e.to_string())?
                .ok_or("etcd closed a watch")?;
            if resp.compact_revision() > 0 {
                return Ok(resp.compact_revision() as u64);
            }
            if resp.created() {
                // etcd checks the compaction when it first syncs the watcher; a watcher it
                // accepted at `below` means nothing below is compacted... as of now.
                continue;
            }
            return Ok(below);
        }
    }

    /// Whether etcd still has revision `rev` (a read of one key at it; etcd refuses a
    /// compacted revision).
    pub async fn has_revision(&self, key: &[u8], rev: u64) -> Result<bool, String> {
        let key = crate::keys::probe_key(key);
        let opts = etcd_client::GetOptions::new()
            .with_revision(rev as i64)
            .with_count_only()
            .with_serializable();
        match self.client.kv_client().get(key, Some(opts)).await {
            Ok(_) => Ok(true),
            Err(e) if e.to_string().contains("required revision has been compacted") => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The raw channel (for the transparent forwarder); `None` in a library cache.
    pub fn channel(&self) -> Option<Channel> {
        self.channel.clone()
    }

    fn raw(&self) -> Result<Channel, Status> {
        self.channel
            .clone()
            .ok_or_else(|| Status::unimplemented("no raw channel to etcd in a library cache"))
    }

    /// A gRPC client on the raw channel, ready, that takes responses as large as clientv3 does.
    async fn grpc(&self) -> Result<tonic::client::Grpc<Channel>, Status> {
        grpc_on(self.raw()?).await
    }

    /// A KV client of the cache's own connection that takes responses as large as clientv3
    /// does (for reads that may be large: pass-through, the consistency check).
    pub fn kv(&self) -> etcd_client::KvClient {
        self.client.kv_client().max_decoding_message_size(MAX_RECEIVE_BYTES)
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
        let mut grpc = self.grpc().await?;
        let req = with_metadata(metadata, message);
        grpc.unary(req, PathAndQuery::from_static(path), tonic_prost::ProstCodec::default()).await
    }

    /// Opens a watch stream to etcd on the relays' connection with the client's metadata,
    /// sending `create` at once (etcd answers the stream's headers only with its first
    /// response); `capacity` requests may wait to be sent.
    pub(crate) async fn relay_watch(
        &self,
        metadata: &MetadataMap,
        capacity: usize,
        create: PbWatchRequest,
    ) -> Result<(mpsc::Sender<PbWatchRequest>, Streaming<PbWatchResponse>), Status> {
        let relays = self
            .relays
            .clone()
            .ok_or_else(|| Status::unimplemented("no raw channel to etcd in a library cache"))?;
        let (tx, rx) = mpsc::channel(capacity.max(1));
        tx.try_send(create).map_err(|_| Status::internal("stream buffer"))?;
        let mut grpc = grpc_on(relays).await?;
        let req = with_metadata(metadata, ReceiverStream::new(rx));
        let path = PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        let resp = grpc.streaming(req, path, tonic_prost::ProstCodec::default()).await?;
        Ok((tx, resp.into_inner()))
    }
}

/// A gRPC client on `channel`, ready, that takes responses as large as clientv3 does.
async fn grpc_on(channel: Channel) -> Result<tonic::client::Grpc<Channel>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RECEIVE_BYTES);
    grpc.ready().await.map_err(|e| Status::unavailable(format!("etcd unavailable: {e}")))?;
    Ok(grpc)
}

/// etcd's refusal of a token it does not know (`auth.ErrInvalidAuthToken`).
pub const ERR_INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";

/// Whether an error from etcd refuses the token a call carried (clientv3 then authenticates
/// again, `shouldRefreshToken`): invalid (expired, or forgotten by a restart), or issued
/// before the last change to users and roles (JWT tokens).
pub(crate) fn is_token_refusal(text: &str) -> bool {
    text.contains(ERR_INVALID_AUTH_TOKEN)
        || text.contains("etcdserver: revision of auth store is old")
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

/// The sending half of a watch on etcd.
pub(crate) enum UpWatchTx {
    Raw(mpsc::Sender<PbWatchRequest>),
    Client(etcd_client::WatchRequestSender),
}

impl UpWatchTx {
    /// Asks etcd for the stream's progress.
    pub(crate) async fn request_progress(&mut self) -> Result<(), ()> {
        match self {
            UpWatchTx::Raw(tx) => {
                let req = PbWatchRequest {
                    request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
                };
                tx.send(req).await.map_err(|_| ())
            }
            UpWatchTx::Client(tx) => tx.request_progress().await.map_err(|_| ()),
        }
    }
}

/// The receiving half of a watch on etcd.
pub(crate) enum UpWatchRx {
    Raw(Streaming<PbWatchResponse>),
    Client(etcd_client::WatchResponseStream),
}

impl UpWatchRx {
    /// The next response (`None`: the stream ended).
    pub(crate) async fn message(&mut self) -> Result<Option<PbWatchResponse>, Status> {
        match self {
            UpWatchRx::Raw(rx) => rx.message().await,
            UpWatchRx::Client(rx) => match rx.message().await {
                Ok(r) => Ok(r.map(|r| r.0)),
                Err(etcd_client::Error::GRpcStatus(s)) => Err(s),
                Err(e) => Err(Status::unavailable(e.to_string())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_waits_out_an_etcd_that_does_not_answer_but_not_a_refusal() {
        let grpc = |code, msg: &str| etcd_client::Error::GRpcStatus(Status::new(code, msg));
        let waits = |e| ConnectFailure::of("etcd status".into(), e).unreachable;
        assert!(waits(grpc(tonic::Code::Unavailable, "tcp connect error")));
        assert!(waits(grpc(tonic::Code::Unavailable, "etcdserver: leader changed")));
        assert!(waits(grpc(tonic::Code::DeadlineExceeded, "context deadline exceeded")));
        assert!(waits(etcd_client::Error::IoError(std::io::ErrorKind::ConnectionRefused.into())));
        let bad_password = "etcdserver: authentication failed, invalid user ID or password";
        assert!(!waits(grpc(tonic::Code::InvalidArgument, bad_password)));
        assert!(!waits(grpc(tonic::Code::Unavailable, "invalid peer certificate: UnknownIssuer")));
        assert!(!waits(etcd_client::Error::InvalidArgs("no endpoints".into())));
    }
}
