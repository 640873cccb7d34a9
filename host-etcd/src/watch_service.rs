//! etcd's `Watch` service: one session per client stream, many watches per session, each served
//! from a cache where etcd's semantics allow and from its own etcd watch otherwise.
//!
//! etcd counterparts: `server/etcdserver/api/v3rpc/watch.go` (`serverWatchStream`: `recvLoop`,
//! `sendLoop`, watch ids, created/canceled responses, progress) and the gRPC proxy's
//! `server/proxy/grpcproxy/watch.go`, whose lessons this follows: one `created` per watch,
//! progress requests answered (locally), a slow watcher replayed from history rather than
//! cancelled. Kubernetes counterpart: `cacher.go`'s `Watch` for the cache side.
//!
//! Guarantees kept per stream (spec/etcd.md 1.7): a watch's revisions only go up, no event is
//! sent twice, a progress answer at R comes only after every event up to R of every watch on
//! the stream, and whole revisions per response.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

use cacher_core::{CloseCause, KeyRange, RequestId};
use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Status, Streaming};
use tracing::debug;

use crate::cache::{Cmd, EtcdWatchSpec, SessionEvent, WatchStartReply};
use crate::proto::{EncodedEvent, WatchCodec, WatchOut};
use crate::server::Ctx;
use crate::upstream::forwardable;

/// Largest response the session builds from cached events (whole revisions are never split).
const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Responses buffered towards the client before the session waits for it...
const OUT_BUFFER: usize = 64;
/// ...and their bytes: what a client that stops reading costs, beyond HTTP/2's own buffers.
const OUT_BYTES: usize = 2 << 20;
/// `mvcc.ErrWatcherDuplicateID`.
const ERR_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// `mvcc.ErrEmptyWatcherRange`.
const ERR_EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// The token of periodic progress checks.
const PERIODIC: u64 = u64::MAX;

/// The axum route for `/etcdserverpb.Watch/Watch`.
pub(crate) async fn route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let mut grpc =
        tonic::server::Grpc::new(WatchCodec).max_decoding_message_size(ctx.max_request_bytes);
    grpc.streaming(tower::service_fn(move |r| watch(ctx.clone(), r)), req).await
}

type OutStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<WatchOut, Status>> + Send>>;

/// An item on its way to the client, holding its share of the session's byte budget until the
/// transport takes it.
pub(crate) type OutItem = (Result<WatchOut, Status>, Option<OwnedSemaphorePermit>);

/// The session's side of the queue towards the client, bounded in responses and in bytes.
pub(crate) struct Outbox {
    tx: mpsc::Sender<OutItem>,
    budget: Arc<Semaphore>,
}

impl Outbox {
    /// A queue and its receiving end.
    pub(crate) fn new() -> (Outbox, mpsc::Receiver<OutItem>) {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        (Outbox { tx, budget: Arc::new(Semaphore::new(OUT_BYTES)) }, rx)
    }

    /// Queues an item, waiting while the client has not taken enough of what came before.
    async fn send(&self, item: Result<WatchOut, Status>) -> Result<(), ()> {
        let n = match &item {
            Ok(o) => o.encoded_len().clamp(1, OUT_BYTES),
            Err(_) => 1,
        };
        let permit = self.budget.clone().acquire_many_owned(n as u32).await.map_err(|_| ())?;
        self.tx.send((item, Some(permit))).await.map_err(|_| ())
    }
}

/// The items as a stream for the transport (each permit is released as the item is taken).
pub(crate) fn out_stream(rx: mpsc::Receiver<OutItem>) -> OutStream {
    Box::pin(futures::StreamExt::map(ReceiverStream::new(rx), |(item, _permit)| item))
}

/// One client Watch stream: a session task reads its requests and feeds the response stream.
async fn watch(
    ctx: Arc<Ctx>,
    req: tonic::Request<Streaming<PbWatchRequest>>,
) -> Result<tonic::Response<OutStream>, Status> {
    let md = forwardable(req.metadata());
    let inbound = req.into_inner();
    let (out, rx) = Outbox::new();
    let session = Session::new(ctx, md, out);
    tokio::spawn(session.run(inbound));
    Ok(tonic::Response::new(out_stream(rx)))
}

/// What a client asked for when creating a watch.
#[derive(Clone, Debug)]
struct CreateSpec {
    /// The request as the client sent it (forwarded as is, with another start revision, when
    /// the watch goes to etcd).
    request: PbWatchRequest,
    range: KeyRange,
    key: Vec<u8>,
    range_end: Vec<u8>,
    start_revision: i64,
    prev_kv: bool,
    filters: Vec<i32>,
    progress_notify: bool,
}

enum Source {
    /// Served by cache `cache` as core watch `id`.
    Cache { cache: usize, id: RequestId },
    /// Served by its own etcd watch (the relay task of this generation).
    Upstream { ctl: mpsc::UnboundedSender<RelayCtl> },
    /// Between sources (waiting for the cache, or for etcd to come back).
    Waiting,
}

struct Watch {
    id: i64,
    tag: u64,
    spec: CreateSpec,
    /// The cache covering its keys, if any.
    cache: Option<usize>,
    /// Every event of this watch up to this revision has been sent.
    last_sent: u64,
    /// Events below this revision are never sent (the start revision).
    min_rev: u64,
    source: Source,
    /// Bumped whenever the source changes: messages of an older source are ignored.
    generation: u64,
    events_since_tick: bool,
    /// Pass-through attempts since the last success (for backoff).
    failures: u32,
}

enum RelayCtl {
    Progress,
}

struct PendingProgress {
    /// Caches asked for their frontier and not answered yet.
    caches: BTreeSet<usize>,
    /// Pass-through watches asked and not answered yet (by tag).
    upstreams: BTreeSet<u64>,
    /// The smallest frontier so far.
    min: u64,
    /// Some watch was not caught up.
    behind: bool,
    token: u64,
    /// When the query was sent (etcd drops a progress request while a watcher on the stream is
    /// still catching up, so unanswered queries are sent again).
    sent: tokio::time::Instant,
}

pub(crate) struct Session {
    ctx: Arc<Ctx>,
    md: MetadataMap,
    out: Outbox,
    events_tx: mpsc::UnboundedSender<SessionEvent>,
    events_rx: mpsc::UnboundedReceiver<SessionEvent>,
    watches: HashMap<i64, Watch>,
    by_tag: HashMap<u64, i64>,
    next_tag: u64,
    next_auto_id: i64,
    credits: HashMap<(usize, RequestId), u64>,
    /// The largest revision sent on the stream (events and progress).
    max_sent: u64,
    progress: Option<PendingProgress>,
    progress_wanted: bool,
    next_token: u64,
    /// Events taken out of the queue while batching, to handle next.
    stash: std::collections::VecDeque<SessionEvent>,
}

enum Flow {
    Continue,
    Stop,
}

impl Session {
    pub(crate) fn new(ctx: Arc<Ctx>, md: MetadataMap, out: Outbox) -> Session {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Session {
            ctx,
            md,
            out,
            events_tx,
            events_rx,
            watches: HashMap::default(),
            by_tag: HashMap::default(),
            next_tag: 1,
            next_auto_id: 0,
            credits: HashMap::default(),
            max_sent: 0,
            progress: None,
            progress_wanted: false,
            next_token: 1,
            stash: std::collections::VecDeque::new(),
        }
    }

    /// Serves one stream of watch requests until it ends, the client goes away, or the server
    /// shuts down.
    pub(crate) async fn run<S>(mut self, mut inbound: S)
    where
        S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin + Send,
    {
        self.ctx.metrics.grpc_stream(1);
        let mut shutdown = self.ctx.shutdown.clone();
        let period = self.ctx.progress_notify_interval;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let flow = tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    let _ = self.out.send(Err(Status::unavailable("watchcache is shutting down"))).await;
                    Flow::Stop
                }
                m = futures::StreamExt::next(&mut inbound) => match m {
                    Some(Ok(req)) => self.on_request(req).await,
                    None => Flow::Stop,
                    Some(Err(e)) => {
                        // A request etcd could not read ends the stream with etcd's error (a
                        // client that went away never sees it).
                        debug!(error = %e, "watch stream ended");
                        let _ = self.out.send(Err(e)).await;
                        Flow::Stop
                    }
                },
                Some(ev) = next_event(&mut self.stash, &mut self.events_rx) => self.on_event(ev).await,
                _ = tick.tick() => self.on_tick(),
            };
            if matches!(flow, Flow::Stop) {
                break;
            }
        }
        for (_, w) in self.watches.drain() {
            stop_source(&self.ctx, &w.source);
            self.ctx.metrics.grpc_watcher(-1);
        }
        self.ctx.metrics.grpc_stream(-1);
    }

    async fn send(&mut self, out: WatchOut) -> Flow {
        match self.out.send(Ok(out)).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Stop,
        }
    }

    async fn send_msg(&mut self, r: PbWatchResponse) -> Flow {
        self.send(WatchOut::msg(r)).await
    }

    fn current_rev(&self) -> u64 {
        self.ctx.caches.iter().map(|c| c.status().rv).max().unwrap_or(0)
    }

    fn header(&self, rev: u64) -> Option<etcd_client::proto::PbResponseHeader> {
        Some(self.ctx.upstream.header(rev as i64))
    }

    // ----- client requests ------------------------------------------------------------------

    async fn on_request(&mut self, req: PbWatchRequest) -> Flow {
        match req.request_union.clone() {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                let spec = CreateSpec {
                    request: req,
                    range: KeyRange::Exact(cacher_core::Key::new(b"")),
                    key: c.key.clone(),
                    range_end: c.range_end.clone(),
                    start_revision: c.start_revision,
                    prev_kv: c.prev_kv,
                    filters: c.filters.clone(),
                    progress_notify: c.progress_notify,
                };
                self.create(spec, c.watch_id).await
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => self.cancel(c.watch_id).await,
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                self.progress_wanted = true;
                if self.progress.is_none() {
                    self.start_progress_query();
                }
                self.maybe_answer_progress().await
            }
            // etcd ignores request types it does not know.
            None => Flow::Continue,
        }
    }

    async fn reject_create(&mut self, watch_id: i64, reason: String) -> Flow {
        let rev = self.current_rev();
        self.send_msg(PbWatchResponse {
            header: self.header(rev),
            watch_id,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        })
        .await
    }

    async fn create(&mut self, mut spec: CreateSpec, requested_id: i64) -> Flow {
        // etcd's normalisation: an empty key is "\0", "\0" as the end means "from key".
        let key = if spec.key.is_empty() { vec![0u8] } else { spec.key.clone() };
        let range = if spec.range_end.is_empty() {
            KeyRange::Exact(cacher_core::Key::new(&key))
        } else if spec.range_end == [0] {
            KeyRange::Range { start: cacher_core::Key::new(&key), end: None }
        } else {
            KeyRange::Range {
                start: cacher_core::Key::new(&key),
                end: Some(cacher_core::Key::new(&spec.range_end)),
            }
        };
        spec.range = range;
        // Watch id: the client's, or the next free one (etcd's AutoWatchID = 0).
        let id = if requested_id != 0 {
            if self.watches.contains_key(&requested_id) {
                return self.reject_create(-1, ERR_DUPLICATE_ID.to_owned()).await;
            }
            requested_id
        } else {
            while self.watches.contains_key(&self.next_auto_id) {
                self.next_auto_id += 1;
            }
            self.next_auto_id
        };
        if let KeyRange::Range { start, end: Some(end) } = &spec.range {
            if start.as_bytes() >= end.as_bytes() {
                return self.reject_create(-1, ERR_EMPTY_RANGE.to_owned()).await;
            }
        }
        if spec.start_revision < 0 {
            // etcd forwards it to the store, which refuses it as compacted.
            return self
                .reject_create(
                    -1,
                    "etcdserver: mvcc: required revision has been compacted".to_owned(),
                )
                .await;
        }
        let cache = self.ctx.cache_for(&spec.range);
        if let Some(c) = cache {
            // The cache answers only what etcd would let this client see.
            let end = if spec.range_end.is_empty() { Vec::new() } else { spec.range_end.clone() };
            if let Err(status) = self.ctx.auth.check(&self.md, &key, &end).await {
                if is_permission_error(&status) {
                    return self.reject_create(id, go_status_string(&status)).await;
                }
                // etcd unreachable: let etcd's own watch say what happens.
                debug!(cache = c, error = %status, "permission check failed; passing the watch through");
                let start = spec.start_revision.max(0) as u64;
                self.insert_watch(id, spec.clone(), None);
                return self.open_upstream(id, spec, start, true).await;
            }
        }
        let start = spec.start_revision.max(0) as u64;
        self.insert_watch(id, spec.clone(), cache);
        if let Some(c) = cache {
            let compacted = self.ctx.compacted();
            if start == 0 || start > compacted {
                let handle = self.ctx.caches[c].clone();
                if handle.wait_ready(self.ctx.create_wait).await {
                    let rv = handle.status().rv;
                    if let Some(w) = self.watches.get_mut(&id) {
                        if start == 0 {
                            // "From now": the cache's revision is this watch's now.
                            w.last_sent = rv;
                            w.min_rev = rv + 1;
                        }
                    }
                    if self.start_cached(id, c).await {
                        self.ctx.metrics.count_watch(true);
                        let rev = handle.status().rv.max(rv);
                        return self
                            .send_msg(PbWatchResponse {
                                header: self.header(rev),
                                watch_id: id,
                                created: true,
                                ..Default::default()
                            })
                            .await;
                    }
                    if let Some(w) = self.watches.get_mut(&id) {
                        // Not served from the cache: etcd decides "now" itself.
                        w.last_sent = start.saturating_sub(1);
                        w.min_rev = start;
                    }
                }
            }
        }
        self.open_upstream(id, spec, start, true).await
    }

    fn insert_watch(&mut self, id: i64, spec: CreateSpec, cache: Option<usize>) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let start = spec.start_revision.max(0) as u64;
        let w = Watch {
            id,
            tag,
            min_rev: start,
            last_sent: start.saturating_sub(1),
            spec,
            cache,
            source: Source::Waiting,
            generation: 0,
            events_since_tick: false,
            failures: 0,
        };
        self.watches.insert(id, w);
        self.by_tag.insert(tag, id);
        self.ctx.metrics.grpc_watcher(1);
    }

    async fn cancel(&mut self, id: i64) -> Flow {
        let Some(w) = self.watches.remove(&id) else { return Flow::Continue };
        self.by_tag.remove(&w.tag);
        stop_source(&self.ctx, &w.source);
        self.ctx.metrics.grpc_watcher(-1);
        let rev = self.current_rev().max(w.last_sent);
        self.send_msg(PbWatchResponse {
            header: self.header(rev),
            watch_id: id,
            canceled: true,
            ..Default::default()
        })
        .await
    }

    // ----- progress -------------------------------------------------------------------------

    fn start_progress_query(&mut self) {
        let token = self.next_token;
        self.next_token += 1;
        let mut per_cache: HashMap<usize, Vec<(u64, RequestId)>> = HashMap::default();
        let mut upstreams = BTreeSet::new();
        for w in self.watches.values() {
            match &w.source {
                Source::Cache { cache, id } => {
                    per_cache.entry(*cache).or_default().push((w.tag, *id))
                }
                Source::Upstream { ctl } => {
                    if ctl.send(RelayCtl::Progress).is_ok() {
                        upstreams.insert(w.tag);
                    }
                }
                Source::Waiting => {}
            }
        }
        let waiting = self.watches.values().any(|w| matches!(w.source, Source::Waiting));
        let mut caches = BTreeSet::new();
        for (c, watches) in per_cache {
            if self.ctx.caches[c]
                .send(Cmd::Frontier { watches, sink: self.events_tx.clone(), token })
                .is_ok()
            {
                caches.insert(c);
            }
        }
        let min =
            if caches.is_empty() && upstreams.is_empty() { self.current_rev() } else { u64::MAX };
        if !upstreams.is_empty() {
            let tx = self.events_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let _ = tx.send(SessionEvent::ProgressRetry);
            });
        }
        let sent = tokio::time::Instant::now();
        self.progress =
            Some(PendingProgress { caches, upstreams, min, behind: waiting, token, sent });
    }

    /// Sends the progress answer once every source has answered, if it keeps the guarantees;
    /// otherwise asks again shortly.
    async fn maybe_answer_progress(&mut self) -> Flow {
        let Some(p) = &self.progress else { return Flow::Continue };
        if !p.caches.is_empty() || !p.upstreams.is_empty() {
            return Flow::Continue;
        }
        let (min, behind) = (p.min, p.behind);
        self.progress = None;
        if !self.progress_wanted {
            return Flow::Continue;
        }
        if behind || min == u64::MAX || min < self.max_sent {
            // Not every watch has caught up: etcd answers when they have; ask again soon.
            let tx = self.events_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(SessionEvent::ProgressRetry);
            });
            return Flow::Continue;
        }
        self.progress_wanted = false;
        self.max_sent = min;
        for w in self.watches.values_mut() {
            w.last_sent = w.last_sent.max(min);
        }
        self.send_msg(PbWatchResponse {
            header: self.header(min),
            watch_id: -1,
            ..Default::default()
        })
        .await
    }

    fn on_tick(&mut self) -> Flow {
        let mut per_cache: HashMap<usize, Vec<(u64, RequestId)>> = HashMap::default();
        for w in self.watches.values_mut() {
            if w.spec.progress_notify && !w.events_since_tick {
                if let Source::Cache { cache, id } = &w.source {
                    per_cache.entry(*cache).or_default().push((w.tag, *id));
                }
            }
            w.events_since_tick = false;
        }
        for (c, watches) in per_cache {
            let _ = self.ctx.caches[c].send(Cmd::Frontier {
                watches,
                sink: self.events_tx.clone(),
                token: PERIODIC,
            });
        }
        Flow::Continue
    }

    // ----- events from caches and relays ----------------------------------------------------

    async fn on_event(&mut self, ev: SessionEvent) -> Flow {
        match ev {
            SessionEvent::Events { tag, header_rev, events, credit } => {
                // Batch what is already queued: consecutive deliveries for a watch go out as one
                // response (whole revisions), so a session that fell behind catches up in
                // fewer, larger messages.
                let mut batches: Vec<Batch> = vec![(tag, header_rev, vec![events], credit)];
                while batches.len() < 64 {
                    match self.events_rx.try_recv() {
                        Ok(SessionEvent::Events { tag, header_rev, events, credit }) => {
                            match batches.iter_mut().find(|b| b.0 == tag) {
                                Some(b) => {
                                    b.1 = b.1.max(header_rev);
                                    b.2.push(events);
                                    b.3 += credit;
                                }
                                None => batches.push((tag, header_rev, vec![events], credit)),
                            }
                        }
                        Ok(other) => {
                            self.stash.push_back(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                for (tag, header_rev, parts, credit) in batches {
                    let events: Arc<[EncodedEvent]> = if parts.len() == 1 {
                        parts.into_iter().next().unwrap_or_else(|| Arc::from(Vec::new()))
                    } else {
                        parts.iter().flat_map(|p| p.iter().cloned()).collect::<Vec<_>>().into()
                    };
                    if let Flow::Stop = self.on_events(tag, header_rev, events, credit).await {
                        return Flow::Stop;
                    }
                }
                Flow::Continue
            }
            SessionEvent::Skipped { tag, last_rev } => {
                if let Some(w) = self.by_tag.get(&tag).and_then(|id| self.watches.get_mut(id)) {
                    w.last_sent = w.last_sent.max(last_rev);
                }
                Flow::Continue
            }
            SessionEvent::Closed { tag, cause, last_rv, message } => {
                let Some(&id) = self.by_tag.get(&tag) else { return Flow::Continue };
                let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
                if !matches!(w.source, Source::Cache { .. }) {
                    return Flow::Continue;
                }
                debug!(watch_id = id, cause = cause.as_str(), last_rv, message = ?message, "cached watch ended; resuming elsewhere");
                w.last_sent = w.last_sent.max(last_rv);
                w.source = Source::Waiting;
                w.generation += 1;
                let wait = if cause == CloseCause::Error {
                    Duration::ZERO
                } else {
                    Duration::from_secs(10)
                };
                let cache = w.cache;
                self.schedule_resume(tag, cache, wait);
                Flow::Continue
            }
            SessionEvent::Frontier { token, results, cache_rv } => {
                self.on_frontier(token, results, cache_rv).await
            }
            SessionEvent::Upstream { tag, generation, resp } => {
                self.on_upstream(tag, generation, resp).await
            }
            SessionEvent::Retry { tag } => {
                let Some(&id) = self.by_tag.get(&tag) else { return Flow::Continue };
                self.resume(id).await
            }
            SessionEvent::ProgressRetry => {
                let stale = self
                    .progress
                    .as_ref()
                    .is_some_and(|p| p.sent.elapsed() >= Duration::from_millis(200));
                if stale {
                    self.progress = None;
                }
                if self.progress_wanted && self.progress.is_none() {
                    self.start_progress_query();
                    return self.maybe_answer_progress().await;
                }
                Flow::Continue
            }
        }
    }

    async fn on_events(
        &mut self,
        tag: u64,
        header_rev: u64,
        events: Arc<[EncodedEvent]>,
        credit: u64,
    ) -> Flow {
        let Some(&id) = self.by_tag.get(&tag) else { return Flow::Continue };
        let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
        let Source::Cache { cache, id: core_id } = w.source else { return Flow::Continue };
        w.events_since_tick = true;
        let watch_id = w.id;
        // Whole revisions per response, at most about MAX_RESPONSE_BYTES each.
        let mut frames = Vec::new();
        let mut start = 0;
        let mut size = 0;
        for i in 0..events.len() {
            size += events[i].bytes.len();
            let boundary = i + 1 == events.len() || events[i + 1].rev != events[i].rev;
            if boundary && (size >= MAX_RESPONSE_BYTES || i + 1 == events.len()) {
                frames.push(start..i + 1);
                start = i + 1;
                size = 0;
            }
        }
        let last = events.last().map_or(0, |e| e.rev);
        let header_rev = header_rev.max(last);
        for range in frames {
            let out = WatchOut::Frame {
                header: self.ctx.upstream.header(header_rev as i64),
                watch_id,
                events: events.clone(),
                range,
            };
            if let Flow::Stop = self.send(out).await {
                return Flow::Stop;
            }
        }
        if let Some(w) = self.watches.get_mut(&id) {
            w.last_sent = w.last_sent.max(last);
        }
        self.max_sent = self.max_sent.max(last);
        // Return credit in batches.
        let slot = self.credits.entry((cache, core_id)).or_default();
        *slot += credit;
        let threshold = (self.ctx.caches[cache].options.grpc_credit / 4).max(1);
        if *slot >= threshold {
            let n = std::mem::take(slot);
            let _ = self.ctx.caches[cache].send(Cmd::Credit { id: core_id, n });
        }
        Flow::Continue
    }

    async fn on_frontier(
        &mut self,
        token: u64,
        results: Vec<(u64, Option<u64>)>,
        cache_rv: u64,
    ) -> Flow {
        if token == PERIODIC {
            for (tag, rv) in results {
                let Some(rv) = rv else { continue };
                let Some(&id) = self.by_tag.get(&tag) else { continue };
                let Some(w) = self.watches.get_mut(&id) else { continue };
                if !matches!(w.source, Source::Cache { .. })
                    || rv < w.last_sent
                    || rv + 1 < w.min_rev
                    || w.events_since_tick
                {
                    continue;
                }
                w.last_sent = rv;
                let r = PbWatchResponse {
                    header: Some(self.ctx.upstream.header(rv as i64)),
                    watch_id: id,
                    ..Default::default()
                };
                if let Flow::Stop = self.send_msg(r).await {
                    return Flow::Stop;
                }
            }
            return Flow::Continue;
        }
        let Some(p) = self.progress.as_mut() else { return Flow::Continue };
        if p.token != token {
            return Flow::Continue;
        }
        let cache = results
            .first()
            .and_then(|(tag, _)| self.by_tag.get(tag))
            .and_then(|id| self.watches.get(id))
            .and_then(|w| w.cache);
        if results.iter().any(|(_, r)| r.is_none()) {
            p.behind = true;
        }
        p.min = p.min.min(cache_rv);
        match cache {
            Some(c) => {
                p.caches.remove(&c);
            }
            None => {
                // Watches moved away meanwhile: any answer for this token counts as this
                // cache's.
                if let Some(&c) = p.caches.iter().next() {
                    p.caches.remove(&c);
                }
            }
        }
        self.maybe_answer_progress().await
    }

    async fn on_upstream(
        &mut self,
        tag: u64,
        generation: u64,
        resp: Option<Result<PbWatchResponse, Status>>,
    ) -> Flow {
        let Some(&id) = self.by_tag.get(&tag) else { return Flow::Continue };
        let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
        if w.generation != generation || !matches!(w.source, Source::Upstream { .. }) {
            return Flow::Continue;
        }
        let resp = match resp {
            Some(Ok(r)) => r,
            Some(Err(_)) | None => {
                // The connection to etcd broke: resume from the last revision when it is back.
                w.source = Source::Waiting;
                w.generation += 1;
                w.failures += 1;
                self.ctx.metrics.upstream_watch(-1);
                let delay = Duration::from_millis((100u64 << w.failures.min(5)).min(2000));
                let cache = w.cache;
                self.schedule_resume(tag, cache, delay);
                if let Some(p) = self.progress.as_mut() {
                    p.upstreams.remove(&tag);
                    p.behind = true;
                }
                return self.maybe_answer_progress().await;
            }
        };
        w.failures = 0;
        if resp.canceled {
            // etcd ended it (compacted, permission, ...): the client hears it as etcd said it.
            if resp.compact_revision > 0 {
                self.ctx.note_compacted(resp.compact_revision as u64);
            }
            let w = self.watches.remove(&id);
            if let Some(w) = &w {
                self.by_tag.remove(&w.tag);
                self.ctx.metrics.upstream_watch(-1);
                self.ctx.metrics.grpc_watcher(-1);
            }
            let mut r = resp;
            r.watch_id = id;
            r.created = false;
            if let Some(p) = self.progress.as_mut() {
                p.upstreams.remove(&tag);
            }
            if let Flow::Stop = self.send_msg(r).await {
                return Flow::Stop;
            }
            return self.maybe_answer_progress().await;
        }
        if resp.created {
            return Flow::Continue;
        }
        let rev = resp.header.as_ref().map_or(0, |h| h.revision.max(0) as u64);
        if resp.watch_id == -1 {
            // The answer to our progress request: everything up to `rev` was relayed.
            w.last_sent = w.last_sent.max(rev);
            let cache = w.cache;
            if let Some(p) = self.progress.as_mut() {
                if p.upstreams.remove(&tag) {
                    p.min = p.min.min(rev);
                }
            }
            if let Flow::Stop = self.maybe_answer_progress().await {
                return Flow::Stop;
            }
            if let Some(c) = cache {
                return self.try_rejoin(id, c).await;
            }
            return Flow::Continue;
        }
        let last = resp
            .events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.mod_revision.max(0) as u64)
            .max();
        let mut r = resp;
        r.watch_id = id;
        match last {
            Some(l) => {
                w.last_sent = w.last_sent.max(l);
                w.events_since_tick = true;
                self.max_sent = self.max_sent.max(l);
            }
            None => {
                // A periodic progress notification from etcd.
                if rev < w.last_sent {
                    return Flow::Continue;
                }
                w.last_sent = rev;
            }
        }
        self.send_msg(r).await
    }

    // ----- sources ----------------------------------------------------------------------------

    fn schedule_resume(&self, tag: u64, cache: Option<usize>, wait: Duration) {
        let tx = self.events_tx.clone();
        let handle = cache.map(|c| self.ctx.caches[c].clone());
        tokio::spawn(async move {
            match handle {
                Some(h) if !wait.is_zero() => {
                    h.wait_ready(wait).await;
                }
                _ => tokio::time::sleep(wait).await,
            }
            let _ = tx.send(SessionEvent::Retry { tag });
        });
    }

    /// Puts a waiting watch back on a source: the cache if it can serve from the watch's last
    /// revision, otherwise its own etcd watch from there.
    async fn resume(&mut self, id: i64) -> Flow {
        let Some(w) = self.watches.get(&id) else { return Flow::Continue };
        if !matches!(w.source, Source::Waiting) {
            return Flow::Continue;
        }
        if let Some(c) = w.cache {
            if self.start_cached(id, c).await {
                return Flow::Continue;
            }
        }
        let Some(w) = self.watches.get(&id) else { return Flow::Continue };
        let from = w.last_sent + 1;
        let spec = w.spec.clone();
        self.open_upstream(id, spec, from, false).await
    }

    async fn try_rejoin(&mut self, id: i64, cache: usize) -> Flow {
        let Some(w) = self.watches.get(&id) else { return Flow::Continue };
        let status = self.ctx.caches[cache].status();
        let servable = status.ready && status.oldest_servable.is_some_and(|o| w.last_sent + 1 >= o);
        if !servable {
            return Flow::Continue;
        }
        let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
        let old = std::mem::replace(&mut w.source, Source::Waiting);
        w.generation += 1;
        stop_source(&self.ctx, &old);
        self.ctx.metrics.upstream_watch(-1);
        if self.start_cached(id, cache).await {
            self.ctx.metrics.count_rejoin();
            return Flow::Continue;
        }
        let Some(w) = self.watches.get(&id) else { return Flow::Continue };
        let from = w.last_sent + 1;
        let spec = w.spec.clone();
        self.open_upstream(id, spec, from, false).await
    }

    /// Registers the watch in cache `c` from its last sent revision; false if the cache cannot.
    async fn start_cached(&mut self, id: i64, c: usize) -> bool {
        let Some(w) = self.watches.get(&id) else { return false };
        let handle = &self.ctx.caches[c];
        let status = handle.status();
        if !status.ready {
            return false;
        }
        let start_after = w.last_sent.min(status.rv);
        let spec = EtcdWatchSpec {
            range: w.spec.range.clone(),
            start_after,
            min_rev: w.min_rev.max(w.last_sent + 1),
            prev_kv: w.spec.prev_kv,
            filters: w.spec.filters.clone(),
            tag: w.tag,
            sink: self.events_tx.clone(),
        };
        let (reply, rx) = oneshot::channel();
        if handle.send(Cmd::EtcdWatch { spec, reply }).is_err() {
            return false;
        }
        match rx.await {
            Ok(WatchStartReply::Started { id: core_id, .. }) => {
                if let Some(w) = self.watches.get_mut(&id) {
                    w.source = Source::Cache { cache: c, id: core_id };
                    w.generation += 1;
                    true
                } else {
                    handle.cancel(core_id);
                    false
                }
            }
            Ok(WatchStartReply::Miss { reason }) => {
                debug!(watch_id = id, %reason, "the cache cannot serve the watch");
                false
            }
            Err(_) => false,
        }
    }

    /// Opens the watch's own etcd watch from revision `from` (0 = now). With `announce`, the
    /// client's `created` response is etcd's; otherwise etcd's is swallowed.
    async fn open_upstream(
        &mut self,
        id: i64,
        spec: CreateSpec,
        from: u64,
        announce: bool,
    ) -> Flow {
        let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
        w.generation += 1;
        let generation = w.generation;
        let tag = w.tag;
        let mut req = spec.request.clone();
        if let Some(PbWatchRequestUnion::CreateRequest(c)) = req.request_union.as_mut() {
            c.start_revision = from as i64;
            c.watch_id = 0;
        }
        let (created_tx, created_rx) = oneshot::channel();
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        self.ctx.metrics.count_upstream_request("watch");
        self.ctx.metrics.count_watch(false);
        tokio::spawn(relay(
            self.ctx.clone(),
            self.md.clone(),
            req,
            tag,
            generation,
            self.events_tx.clone(),
            created_tx,
            ctl_rx,
            w.cache.is_some(),
        ));
        let created = match tokio::time::timeout(Duration::from_secs(10), created_rx).await {
            Ok(Ok(Ok(r))) => Ok(r),
            Ok(Ok(Err(status))) => Err(status.message().to_owned()),
            _ => Err("etcdserver: request timed out".to_owned()),
        };
        let created = match created {
            Ok(r) => r,
            Err(reason) => {
                if !announce {
                    // etcd unreachable while resuming: try again later; the watch stays.
                    let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
                    w.failures += 1;
                    let delay = Duration::from_millis((100u64 << w.failures.min(5)).min(2000));
                    let cache = w.cache;
                    self.schedule_resume(tag, cache, delay);
                    return Flow::Continue;
                }
                self.remove_watch(id);
                return self.reject_create(id, reason).await;
            }
        };
        if created.canceled {
            // etcd refused it at once (permission, bad range...).
            self.remove_watch(id);
            let mut r = created;
            r.watch_id = id;
            r.created = announce;
            return self.send_msg(r).await;
        }
        self.ctx.metrics.upstream_watch(1);
        let Some(w) = self.watches.get_mut(&id) else { return Flow::Continue };
        w.source = Source::Upstream { ctl };
        if announce {
            let mut r = created;
            r.watch_id = id;
            return self.send_msg(r).await;
        }
        Flow::Continue
    }

    fn remove_watch(&mut self, id: i64) {
        if let Some(w) = self.watches.remove(&id) {
            self.by_tag.remove(&w.tag);
            stop_source(&self.ctx, &w.source);
            self.ctx.metrics.grpc_watcher(-1);
        }
    }
}

/// Deliveries for one watch gathered from the queue: tag, header revision, the parts, credit.
type Batch = (u64, u64, Vec<Arc<[EncodedEvent]>>, u64);

/// The next event: one set aside while batching, else the queue's.
async fn next_event(
    stash: &mut std::collections::VecDeque<SessionEvent>,
    rx: &mut mpsc::UnboundedReceiver<SessionEvent>,
) -> Option<SessionEvent> {
    match stash.pop_front() {
        Some(ev) => Some(ev),
        None => rx.recv().await,
    }
}

fn stop_source(ctx: &Ctx, source: &Source) {
    match source {
        Source::Cache { cache, id } => ctx.caches[*cache].cancel(*id),
        // Dropping the control channel ends the relay and its etcd stream.
        Source::Upstream { .. } | Source::Waiting => {}
    }
}

/// A gRPC status as etcd's watch server writes it into a cancel reason (Go's `status.Error`
/// string).
fn go_status_string(s: &Status) -> String {
    let code = match s.code() {
        tonic::Code::PermissionDenied => "PermissionDenied",
        tonic::Code::Unauthenticated => "Unauthenticated",
        tonic::Code::InvalidArgument => "InvalidArgument",
        tonic::Code::FailedPrecondition => "FailedPrecondition",
        other => return format!("rpc error: code = {other:?} desc = {}", s.message()),
    };
    format!("rpc error: code = {code} desc = {}", s.message())
}

/// Whether an etcd error is a refusal (to pass on) rather than a failure to reach etcd.
pub(crate) fn is_permission_error(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
    )
}

/// A pass-through watch's own etcd stream: the first response answers `created`, the rest go
/// to the session; progress requests go up when the session asks (to rejoin the cache, or to
/// answer the client).
#[allow(clippy::too_many_arguments)]
async fn relay(
    ctx: Arc<Ctx>,
    md: MetadataMap,
    create: PbWatchRequest,
    tag: u64,
    generation: u64,
    sink: mpsc::UnboundedSender<SessionEvent>,
    created: oneshot::Sender<Result<PbWatchResponse, Status>>,
    mut ctl: mpsc::UnboundedReceiver<RelayCtl>,
    rejoinable: bool,
) {
    let (mut tx, mut stream) = match ctx.upstream.open_watch(&md, create).await {
        Ok(x) => x,
        Err(s) => {
            let _ = created.send(Err(s));
            return;
        }
    };
    match stream.message().await {
        Ok(Some(r)) => {
            if created.send(Ok(r)).is_err() {
                return;
            }
        }
        Ok(None) => {
            let _ = created.send(Err(Status::unavailable("etcd closed the watch stream")));
            return;
        }
        Err(s) => {
            let _ = created.send(Err(s));
            return;
        }
    }
    // While relaying, ask etcd now and then how far it has got, so the watch can move back
    // onto the cache once it is inside the cache's window.
    let period = ctx.rejoin_interval;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            c = ctl.recv() => match c {
                Some(RelayCtl::Progress) => {
                    if tx.request_progress().await.is_err() {
                        let _ = sink.send(SessionEvent::Upstream { tag, generation, resp: None });
                        return;
                    }
                }
                None => return,
            },
            _ = tick.tick(), if rejoinable => {
                if tx.request_progress().await.is_err() {
                    let _ = sink.send(SessionEvent::Upstream { tag, generation, resp: None });
                    return;
                }
            }
            m = stream.message() => {
                let item = match m {
                    Ok(Some(r)) => Some(Ok(r)),
                    Ok(None) => None,
                    Err(s) => Some(Err(s)),
                };
                let end = !matches!(item, Some(Ok(_)));
                if sink.send(SessionEvent::Upstream { tag, generation, resp: item }).is_err() || end {
                    return;
                }
            }
        }
    }
}
