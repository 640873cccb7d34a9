//! The tokio driver of a [`WatchSession`]: it feeds the session the client's requests, the
//! caches' messages, the relays' responses and the time, and carries out what the session asks
//! (responses into the bounded outbox, commands to the cache tasks, relay tasks, permission
//! checks). It holds no logic of its own beyond flow control: while the outbox is full it stops
//! taking cache messages and relay responses (the caches then hold events for the session's
//! watches within their credit, and the relays stop reading etcd's streams).
//!
//! etcd counterpart: the goroutines of `v3rpc/watch.go` (`recvLoop`, `sendLoop`) and, for the
//! relays, the gRPC proxy's `watch_broadcast.go`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::proto::{PbWatchRequest, PbWatchResponse};
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tonic::metadata::MetadataMap;
use tonic::Status;
use tracing::debug;

use super::{
    CacheCmd, CacheView, Note, Permission, RelayEvent, RelayId, Response, SessionConfig,
    SessionOutput, UpstreamCmd, WatchSession,
};
use crate::cache::delivery::{CacheMsg, SessionId};
use crate::cache::{CacheHandle, CacheStatus, EtcdWatchStart};
use crate::clock::Clock;
use crate::metrics::HostMetrics;
use crate::queue;
use crate::upstream::Upstream;

/// Decides whether a client may read a range (etcd auth), for cached watches.
pub trait Permissions: Send + Sync + 'static {
    /// etcd's decision for the client with metadata `md` on `[key, range_end)`.
    fn check(
        &self,
        md: MetadataMap,
        key: Vec<u8>,
        range_end: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = Permission> + Send>>;

    /// The decision without asking anyone, when there is one (auth off: every read is allowed).
    fn check_now(&self) -> Option<Permission> {
        None
    }
}

/// What every session of one server or library cache shares.
pub struct SessionEnv {
    /// The caches, in the order sessions number them.
    pub caches: Vec<CacheHandle>,
    /// The connection to etcd (relays, headers).
    pub upstream: Upstream,
    /// The host's counters.
    pub metrics: Arc<HostMetrics>,
    /// Permission checks for cached watches (the server with etcd auth on), if any.
    pub permissions: Option<Arc<dyn Permissions>>,
    /// The only clock.
    pub clock: Clock,
    /// The sessions' settings.
    pub config: SessionConfig,
    /// Set when the host shuts down.
    pub shutdown: watch::Receiver<bool>,
}

/// Responses buffered towards the client before the session waits for it...
const OUT_ITEMS: usize = 64;
/// ...and their bytes: what a stream whose client stops reading costs, beyond HTTP/2's flow
/// control window (a response larger than this still goes, alone).
pub const OUT_BYTES: usize = 256 << 10;
/// Responses the driver holds before it stops taking relayed input for the client.
const PENDING_BYTES: usize = 128 << 10;

/// What goes to the client's transport.
pub enum OutItem {
    /// Responses, a batch per wake-up (the server writes a batch as one HTTP/2 data frame),
    /// holding their share of the outbox's byte budget until the transport takes them.
    Batch(Vec<Response>, OwnedSemaphorePermit),
    /// The error that ends the stream.
    End(Box<Status>),
}

/// The session's side of the queue towards the client, bounded in responses and in bytes.
pub struct Outbox {
    tx: queue::Sender<OutItem>,
    budget: Arc<Semaphore>,
}

impl Outbox {
    /// A queue and its receiving end.
    pub fn new() -> (Outbox, queue::Receiver<OutItem>) {
        let (tx, rx) = queue::bounded(OUT_ITEMS);
        (Outbox { tx, budget: Arc::new(Semaphore::new(OUT_BYTES)) }, rx)
    }

    /// Ends the stream with `status`.
    async fn fail(&self, status: Status) {
        let _ = self.tx.send_wait(OutItem::End(Box::new(status))).await;
    }

    /// Moves what fits of `pending` to the transport as one batch; returns the batch's credit.
    fn push(&self, pending: &mut Pending) -> Vec<super::Credit> {
        let mut credits = Vec::new();
        if pending.items.is_empty() {
            return credits;
        }
        // The outbox's only sender: room now is room when the batch is sent.
        if !self.tx.has_room() {
            return credits;
        }
        let available = self.budget.available_permits();
        let (mut take, mut bytes) = (0usize, 0usize);
        for r in pending.items.iter() {
            let size = budget_size(r);
            if bytes + size > available {
                break;
            }
            bytes += size;
            take += 1;
        }
        if take == 0 {
            return credits;
        }
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(bytes as u32) else {
            return credits;
        };
        // Everything fits (the usual case): the pending buffer becomes the batch, and an idle
        // stream keeps no buffer. A buffer grown while the client was not reading is not
        // passed on (a batch waits in the outbox with its whole capacity).
        let all = take == pending.items.len();
        let batch: Vec<Response> = if all && pending.items.capacity() <= 2 * take {
            std::mem::take(&mut pending.items).into()
        } else {
            let batch = pending.items.drain(..take).collect();
            super::release(&mut pending.items);
            batch
        };
        pending.bytes = pending.bytes.saturating_sub(bytes);
        for r in &batch {
            if let Response::Events(e) = r {
                credits.extend(e.credit);
            }
        }
        // A client that went away takes nothing (the session ends on `closed`).
        let _ = self.tx.try_send(OutItem::Batch(batch, permit));
        credits
    }
}

/// The responses the driver holds for the client, and their bytes as [`budget_size`] counts
/// them (taken out the same way by [`Outbox::push`]).
#[derive(Default)]
struct Pending {
    items: VecDeque<Response>,
    bytes: usize,
}

impl Pending {
    fn push_back(&mut self, r: Response) {
        self.bytes += budget_size(&r);
        self.items.push_back(r);
    }

    /// Whether the driver may take more relayed input for the client.
    fn has_room(&self) -> bool {
        self.bytes < PENDING_BYTES && self.items.len() < OUT_ITEMS
    }
}

/// What a response holds of the outbox's byte budget, and of the driver's pending bytes: its
/// size, at least 1, at most the whole budget (a larger response still goes, alone). Counted
/// the same way in and out, or the pending bytes drift and relayed input stops for good.
fn budget_size(r: &Response) -> usize {
    response_size(r).clamp(1, OUT_BYTES)
}

/// Roughly what a response costs on the wire (for the byte budgets).
pub fn response_size(r: &Response) -> usize {
    match r {
        Response::Message(m) => prost::Message::encoded_len(m),
        Response::Events(e) => e.size,
    }
}

enum RelayCtl {
    Progress,
}

/// Serves one client watch stream until it ends, the client goes away, or the host shuts
/// down.
pub async fn run<S>(env: Arc<SessionEnv>, md: MetadataMap, mut inbound: S, out: Outbox)
where
    S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin + Send,
{
    let session_id = SessionId::next();
    let (cache_tx, mut cache_rx) = queue::unbounded::<CacheMsg>();
    // The relays' and permission checks' channels are made when first needed (most streams
    // never use them, and a channel allocates its first block at once).
    let mut relay_rx: Option<mpsc::Receiver<(RelayId, RelayEvent)>> = None;
    let mut perm_rx: Option<mpsc::UnboundedReceiver<(u64, Permission)>> = None;
    let mut statuses: Vec<watch::Receiver<CacheStatus>> =
        env.caches.iter().map(CacheHandle::subscribe).collect();
    let views = env
        .caches
        .iter()
        .map(|c| CacheView { prefix: Arc::from(c.prefix()), status: c.status() })
        .collect();
    let mut session = WatchSession::new(env.config.clone(), views, env.clock.now());
    let mut d = Driver {
        env: env.clone(),
        md,
        session_id,
        cache_tx,
        relay_tx: None,
        perm_tx: None,
        new_relay_rx: None,
        new_perm_rx: None,
        relays: HashMap::default(),
        pending: Pending::default(),
        watch_gauge: 0,
        owed: HashMap::default(),
    };
    env.metrics.grpc_stream(1);
    let mut shutdown = env.shutdown.clone();
    let mut inbound_open = true;
    loop {
        d.carry_out(&mut session);
        if let Some(rx) = d.new_relay_rx.take() {
            relay_rx = Some(rx);
        }
        if let Some(rx) = d.new_perm_rx.take() {
            perm_rx = Some(rx);
        }
        // Hand what is ready to the transport as one batch, as far as the outbox has room;
        // the credit of what it takes goes back to the caches.
        for c in out.push(&mut d.pending) {
            d.give_back(c);
        }
        // Relayed responses wait while the client is not reading (the relays then stop
        // reading etcd); cache messages are bounded by credit and always taken.
        let room = d.pending.has_room();
        let deadline = session.poll_timeout().map(|(t, _)| env.clock.instant_of(t));
        let now = || env.clock.now();
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                out.fail(Status::unavailable("watchcache is shutting down")).await;
                break;
            }
            // The client went away (its end of the stream was dropped).
            _ = out.tx.closed() => break,
            m = futures::StreamExt::next(&mut inbound), if inbound_open => match m {
                Some(Ok(req)) => {
                    refresh(&mut session, &mut statuses);
                    session.handle_request(now(), req);
                }
                // The client closed its sending side: as etcd does, its watches go on until
                // it cancels the call.
                None => inbound_open = false,
                Some(Err(e)) => {
                    // A request etcd could not read ends the stream with etcd's error (a
                    // client that went away never sees it).
                    debug!(error = %e, "watch stream ended");
                    out.fail(e).await;
                    break;
                }
            },
            // The outbox has room again: loop to move what is pending.
            _ = wait_room(&out, d.pending.items.front()), if !d.pending.items.is_empty() => {}
            msg = cache_rx.recv() => {
                if let Some(msg) = msg {
                    refresh(&mut session, &mut statuses);
                    session.handle_cache(now(), msg);
                    // Everything already queued goes together (one batch per wake-up).
                    for _ in 0..64 {
                        match cache_rx.try_recv() {
                            Ok(msg) => session.handle_cache(now(), msg),
                            Err(_) => break,
                        }
                    }
                }
            }
            ev = recv(&mut relay_rx), if room => {
                if let Some((relay, ev)) = ev {
                    refresh(&mut session, &mut statuses);
                    session.handle_relay(now(), relay, ev);
                }
            }
            p = recv_unbounded(&mut perm_rx) => {
                if let Some((token, decision)) = p {
                    refresh(&mut session, &mut statuses);
                    session.handle_permission(now(), token, decision);
                }
            }
            _ = sleep_until(deadline) => {
                refresh(&mut session, &mut statuses);
                session.handle_timeout(now());
            }
        }
    }
    session.close();
    d.carry_out(&mut session);
    env.metrics.grpc_watcher(-d.watch_gauge);
    env.metrics.grpc_stream(-1);
}

/// Gives the session the caches' statuses that changed.
fn refresh(session: &mut WatchSession, statuses: &mut [watch::Receiver<CacheStatus>]) {
    for (i, rx) in statuses.iter_mut().enumerate() {
        if rx.has_changed().unwrap_or(false) {
            let status = rx.borrow_and_update().clone();
            session.handle_cache_status(i, status);
        }
    }
}

async fn wait_room(out: &Outbox, front: Option<&Response>) {
    let size = front.map_or(1, budget_size);
    // Waits until the budget could take it (then gives it back: the loop takes it for good).
    if let Ok(p) = out.budget.clone().acquire_many_owned(size as u32).await {
        drop(p);
    }
    out.tx.ready().await;
}

/// The next item of a channel that may not exist yet (then: never).
async fn recv<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn recv_unbounded<T>(rx: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What the driver answers itself, at once (a cache that is gone, a decision without asking).
enum Feedback {
    Cache(CacheMsg),
    Permission(u64, Permission),
}

struct Driver {
    env: Arc<SessionEnv>,
    md: MetadataMap,
    session_id: SessionId,
    cache_tx: queue::Sender<CacheMsg>,
    relay_tx: Option<mpsc::Sender<(RelayId, RelayEvent)>>,
    perm_tx: Option<mpsc::UnboundedSender<(u64, Permission)>>,
    /// A channel made during the last carry-out, for the run loop to take.
    new_relay_rx: Option<mpsc::Receiver<(RelayId, RelayEvent)>>,
    new_perm_rx: Option<mpsc::UnboundedReceiver<(u64, Permission)>>,
    relays: HashMap<RelayId, mpsc::UnboundedSender<RelayCtl>>,
    pending: Pending,
    watch_gauge: i64,
    /// Credit not yet given back, per cache watch.
    owed: HashMap<(usize, cacher_core::RequestId), u64>,
}

impl Driver {
    fn relay_sender(&mut self) -> mpsc::Sender<(RelayId, RelayEvent)> {
        if let Some(tx) = &self.relay_tx {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(64);
        self.relay_tx = Some(tx.clone());
        self.new_relay_rx = Some(rx);
        tx
    }

    fn perm_sender(&mut self) -> mpsc::UnboundedSender<(u64, Permission)> {
        if let Some(tx) = &self.perm_tx {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.perm_tx = Some(tx.clone());
        self.new_perm_rx = Some(rx);
        tx
    }

    /// Gives credit back to a cache, in batches.
    fn give_back(&mut self, c: super::Credit) {
        let key = (c.cache, c.watch);
        let owed = self.owed.get(&key).copied().unwrap_or(0) + c.n;
        if owed >= self.env.config.credit_batch.max(1) {
            self.owed.remove(&key);
            if let Some(h) = self.env.caches.get(c.cache) {
                h.credit(c.watch, owed);
            }
        } else {
            self.owed.insert(key, owed);
        }
    }

    /// Carries out everything the session asked for; what could not be done (a cache that is
    /// gone) goes back to the session as its answer.
    fn carry_out(&mut self, session: &mut WatchSession) {
        loop {
            let mut feedback: Vec<Feedback> = Vec::new();
            while let Some(o) = session.poll_output() {
                self.one(o, &mut feedback);
            }
            if feedback.is_empty() {
                break;
            }
            let now = self.env.clock.now();
            for f in feedback {
                match f {
                    Feedback::Cache(msg) => session.handle_cache(now, msg),
                    Feedback::Permission(token, d) => session.handle_permission(now, token, d),
                }
            }
        }
        let n = session.watch_count() as i64;
        self.env.metrics.grpc_watcher(n - self.watch_gauge);
        self.watch_gauge = n;
    }

    fn one(&mut self, o: SessionOutput, feedback: &mut Vec<Feedback>) {
        if let SessionOutput::Upstream(UpstreamCmd::Open { relay, request }) = o {
            let tx = self.relay_sender();
            let (ctl, ctl_rx) = mpsc::unbounded_channel();
            self.relays.insert(relay, ctl);
            self.env.metrics.count_upstream_request("watch");
            tokio::spawn(run_relay(
                self.env.upstream.clone(),
                self.md.clone(),
                request,
                relay,
                tx,
                ctl_rx,
                self.env.metrics.clone(),
            ));
            return;
        }
        let env = &self.env;
        match o {
            SessionOutput::Respond(mut r) => {
                // The session writes revisions; etcd's ids come from the connection.
                match &mut r {
                    Response::Message(m) => fill_header(&env.upstream, m),
                    Response::Events(e) => {
                        e.header = env.upstream.header(e.header.revision);
                        env.metrics.add_delivered(e.picks.len() as u64);
                    }
                }
                self.pending.push_back(r);
            }
            SessionOutput::Cache { cache, cmd } => {
                let Some(handle) = env.caches.get(cache) else { return };
                match cmd {
                    CacheCmd::Start { tag, range, start_rev, wait_ready_ms } => {
                        let start = EtcdWatchStart {
                            session: self.session_id,
                            sink: self.cache_tx.clone(),
                            tag,
                            range,
                            start_rev,
                            wait_ready: Duration::from_millis(wait_ready_ms),
                        };
                        if handle.start_etcd_watch(start).is_err() {
                            feedback.push(Feedback::Cache(CacheMsg::Refused {
                                tag,
                                reason: "the cache has stopped".into(),
                            }));
                        }
                    }
                    CacheCmd::Cancel { watch } => handle.cancel(watch),
                    CacheCmd::Credit { watch, n } => handle.credit(watch, n),
                    CacheCmd::Frontier { token, watches, fresh } => {
                        let tags: Vec<_> = watches.iter().map(|(t, _)| (*t, false)).collect();
                        if handle.frontier(token, watches, self.cache_tx.clone(), fresh).is_err() {
                            feedback.push(Feedback::Cache(CacheMsg::Frontier {
                                token,
                                cache_rv: 0,
                                caught_up: tags,
                            }));
                        }
                    }
                    CacheCmd::RequestProgress => handle.request_progress(),
                }
            }
            SessionOutput::Upstream(UpstreamCmd::Open { .. }) => {}
            SessionOutput::Upstream(UpstreamCmd::Progress { relay }) => {
                if let Some(ctl) = self.relays.get(&relay) {
                    let _ = ctl.send(RelayCtl::Progress);
                }
            }
            SessionOutput::Upstream(UpstreamCmd::Close { relay }) => {
                // Dropping the control channel ends the relay and its etcd stream.
                self.relays.remove(&relay);
            }
            SessionOutput::CheckPermission { token, key, range_end } => {
                let now =
                    env.permissions.as_ref().map_or(Some(Permission::Allowed), |p| p.check_now());
                match (now, &env.permissions) {
                    (Some(decision), _) => feedback.push(Feedback::Permission(token, decision)),
                    (None, Some(p)) => {
                        let check = p.check(self.md.clone(), key, range_end);
                        let tx = self.perm_sender();
                        tokio::spawn(async move {
                            let _ = tx.send((token, check.await));
                        });
                    }
                    (None, None) => feedback.push(Feedback::Permission(token, Permission::Allowed)),
                }
            }
            SessionOutput::Note(n) => match n {
                Note::ServedFromCache => env.metrics.count_watch(true),
                Note::ServedFromEtcd => env.metrics.count_watch(false),
                Note::Rejoined => env.metrics.count_rejoin(),
                Note::Compacted(rev) => {
                    for c in &env.caches {
                        c.note_compacted(rev);
                    }
                }
            },
        }
    }
}

/// Fills etcd's cluster and member ids into a header the session wrote (relayed responses
/// keep etcd's own).
fn fill_header(upstream: &Upstream, m: &mut PbWatchResponse) {
    match &mut m.header {
        Some(h) if h.cluster_id == 0 => *h = upstream.header(h.revision),
        Some(_) => {}
        None if m.canceled && m.compact_revision > 0 => {}
        None => m.header = Some(upstream.header(0)),
    }
}

/// One relay: an etcd watch stream for one watch. Its responses go to the session in order
/// (the channel is bounded: while the session waits for its client, the relay stops reading
/// etcd); progress requests go up when the session asks. The upstream-watch gauge counts it
/// while its stream is open.
async fn run_relay(
    upstream: Upstream,
    md: MetadataMap,
    request: PbWatchRequest,
    id: RelayId,
    tx: mpsc::Sender<(RelayId, RelayEvent)>,
    mut ctl: mpsc::UnboundedReceiver<RelayCtl>,
    metrics: Arc<HostMetrics>,
) {
    let opened = tokio::select! {
        o = upstream.open_watch(&md, request) => o,
        // Closed by the session before etcd answered.
        None = ctl.recv() => return,
    };
    let (mut up_tx, mut stream) = match opened {
        Ok(x) => x,
        Err(s) => {
            let ended = RelayEvent::Ended {
                error: Some(go_status_string(&s)),
                unavailable: !is_refusal(&s),
            };
            let _ = tx.send((id, ended)).await;
            return;
        }
    };
    let _gauge = UpstreamWatchGauge::open(&metrics);
    loop {
        tokio::select! {
            c = ctl.recv() => match c {
                Some(RelayCtl::Progress) => {
                    metrics.count_upstream_request("progress");
                    if up_tx.request_progress().await.is_err() {
                        let ended = RelayEvent::Ended { error: Some("etcd closed the watch stream".into()), unavailable: true };
                        let _ = tx.send((id, ended)).await;
                        return;
                    }
                }
                None => return,
            },
            m = stream.message() => {
                let ev = match m {
                    Ok(Some(r)) => RelayEvent::Response(Box::new(r)),
                    Ok(None) => RelayEvent::Ended { error: Some("etcd closed the watch stream".into()), unavailable: true },
                    Err(s) => RelayEvent::Ended { error: Some(go_status_string(&s)), unavailable: !is_refusal(&s) },
                };
                let end = matches!(ev, RelayEvent::Ended { .. });
                if tx.send((id, ev)).await.is_err() || end {
                    return;
                }
            }
        }
    }
}

/// Counts an open upstream watch stream for as long as it lives.
pub(crate) struct UpstreamWatchGauge<'a>(&'a HostMetrics);

impl<'a> UpstreamWatchGauge<'a> {
    pub(crate) fn open(metrics: &'a HostMetrics) -> UpstreamWatchGauge<'a> {
        metrics.upstream_watch(1);
        UpstreamWatchGauge(metrics)
    }
}

impl Drop for UpstreamWatchGauge<'_> {
    fn drop(&mut self) {
        self.0.upstream_watch(-1);
    }
}

/// A gRPC status as etcd's watch server writes it into a cancel reason (Go's `status.Error`
/// string).
pub fn go_status_string(s: &Status) -> String {
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
pub fn is_refusal(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::proto::{PbEvent, PbKeyValue};

    fn relayed(value_bytes: usize) -> Response {
        let kv =
            PbKeyValue { key: b"/k".to_vec(), value: vec![7; value_bytes], ..Default::default() };
        Response::Message(PbWatchResponse {
            watch_id: 1,
            events: vec![PbEvent { kv: Some(kv), ..Default::default() }],
            ..Default::default()
        })
    }

    // Robustness suite, seed 1: two relayed watches of a slow reader stopped for good after a
    // relayed response larger than the budget: it was counted in whole and taken out clamped,
    // so the pending bytes stayed above the limit with nothing pending, and the driver never
    // read its relays again.
    #[test]
    fn pending_bytes_return_to_zero_after_a_response_larger_than_the_budget() {
        let (out, _rx) = Outbox::new();
        let mut pending = Pending::default();
        for r in [relayed(OUT_BYTES + 100_000), relayed(10), relayed(0)] {
            pending.push_back(r);
        }
        assert!(!pending.has_room());
        // The big one goes alone (it takes the whole budget), then the rest.
        let _ = out.push(&mut pending);
        assert_eq!(pending.items.len(), 2);
        assert_eq!(pending.bytes, pending.items.iter().map(budget_size).sum::<usize>());
        let (out, _rx2) = Outbox::new();
        let _ = out.push(&mut pending);
        assert!(pending.items.is_empty());
        assert_eq!(pending.bytes, 0, "nothing pending, nothing counted");
        assert!(pending.has_room(), "relayed input is taken again");
    }
}
