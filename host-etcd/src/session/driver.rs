//! The tokio driver of a [`WatchSession`]: it feeds the session the client's requests, the
//! caches' messages, the relays' responses and the time, and carries out what the session asks
//! (responses for the client, commands to the cache tasks, relay tasks, permission checks).
//!
//! It is not a task of its own: [`SessionDriver::poll_responses`] runs it from wherever the
//! client's responses are read — the HTTP/2 response body of the `Watch` call (one task per
//! stream: hyper's, which writes what it returns), or the library's watch stream. Each call
//! takes in everything that is ready, without waiting, and hands out what the session has
//! answered. So a cache's events reach the client's transport with one task wake-up, and a
//! stream whose client stops reading is not run at all: HTTP/2 stops polling its body once the
//! client's flow-control window is full; the caches then hold its watches' events within their
//! credit (and the watches fall behind into the ring), its relays stop reading etcd (their
//! channel is bounded), and its requests wait in HTTP/2's receive window. Dropping the driver
//! (the client went away) ends the session: cache watches cancelled, relays closed.
//!
//! etcd counterpart: the goroutines of `v3rpc/watch.go` (`recvLoop`, `sendLoop`) and, for the
//! relays, the gRPC proxy's `watch_broadcast.go`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::proto::{PbWatchRequest, PbWatchResponse};
use futures::Stream;
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::WatchStream;
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
use crate::upstream::{
    is_token_refusal, no_leader_status, requires_leader, UpWatchRx, UpWatchTx, Upstream, NO_LEADER,
};

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

/// Relayed responses a session's relays may have sent it that it has not taken yet.
const RELAYED_AHEAD: usize = 8;

/// Responses the driver holds for the client before it stops taking relayed input...
const PENDING_ITEMS: usize = 64;
/// ...and their bytes (a response larger than this still goes, alone).
const PENDING_BYTES: usize = 128 << 10;
/// Inputs taken in one call before the driver hands out what it has (or yields).
const INPUTS_PER_POLL: usize = 256;

/// The responses the driver holds for the client, and their bytes as [`budget_size`] counts
/// them (taken out the same way by [`SessionDriver::poll_responses`]).
#[derive(Default)]
struct Pending {
    items: VecDeque<Response>,
    bytes: usize,
    /// The most responses held at once since the queue was last given back, and that number
    /// from the burst before: an emptied queue is given back (an idle stream holds none), and
    /// the next burst's first response reserves what the last burst needed instead of
    /// growing the queue by doubling each time (1 % of the server's CPU at 1 000 watchers).
    peak: usize,
    last_peak: usize,
}

impl Pending {
    fn push_back(&mut self, r: Response) {
        self.bytes += budget_size(&r);
        if self.items.capacity() == 0 {
            self.items.reserve_exact(self.last_peak.min(PENDING_ITEMS));
        }
        self.items.push_back(r);
        self.peak = self.peak.max(self.items.len());
    }

    /// Gives an emptied queue's buffer back, remembering its burst's size.
    fn release(&mut self) {
        if self.items.is_empty() && self.items.capacity() > 0 {
            self.last_peak = std::mem::take(&mut self.peak);
            self.items = VecDeque::new();
        }
    }

    fn pop_front(&mut self) -> Option<Response> {
        let r = self.items.pop_front()?;
        self.bytes = self.bytes.saturating_sub(budget_size(&r));
        Some(r)
    }

    /// Whether the driver may take more relayed input for the client.
    fn has_room(&self) -> bool {
        self.bytes < PENDING_BYTES && self.items.len() < PENDING_ITEMS
    }
}

/// What a response holds of the driver's pending bytes: its size, at least 1, at most the
/// whole budget (a larger response still goes, alone). Counted the same way in and out, or the
/// pending bytes drift and relayed input stops for good.
fn budget_size(r: &Response) -> usize {
    response_size(r).clamp(1, PENDING_BYTES)
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

/// One client watch stream's session and everything it reads from (see the module's doc).
pub struct SessionDriver<S> {
    env: Arc<SessionEnv>,
    session: WatchSession,
    d: Driver,
    inbound: S,
    inbound_open: bool,
    cache_rx: queue::Receiver<CacheMsg>,
    /// The relays' and permission checks' channels are made when first needed (most streams
    /// never use them, and a channel allocates its first block at once).
    relay_rx: Option<mpsc::Receiver<(RelayId, RelayEvent)>>,
    perm_rx: Option<mpsc::UnboundedReceiver<(u64, Permission)>>,
    statuses: Vec<watch::Receiver<CacheStatus>>,
    /// [`Upstream::outages`] when the stream opened, until the count moves (then `None`).
    outages_at_open: Option<u64>,
    /// The host's shutdown signal, as its changes.
    shutdown: WatchStream<bool>,
    /// For a client that requires a leader (etcd's `hasleader`): whether etcd's member has
    /// none, and its changes.
    leader: Option<WatchStream<bool>>,
    /// The session's next deadline, and its timer.
    timer: Option<(tokio::time::Instant, Pin<Box<tokio::time::Sleep>>)>,
    /// The status that ends the stream, once known (handed out after what is pending).
    end: Option<Status>,
    ended: bool,
}

impl<S> SessionDriver<S>
where
    S: Stream<Item = Result<PbWatchRequest, Status>> + Unpin + Send,
{
    /// A session for one client stream whose requests come from `inbound`.
    pub fn new(env: Arc<SessionEnv>, md: MetadataMap, inbound: S) -> SessionDriver<S> {
        let (cache_tx, cache_rx) = queue::unbounded::<CacheMsg>();
        let statuses = env.caches.iter().map(CacheHandle::subscribe).collect();
        let views = env
            .caches
            .iter()
            .map(|c| CacheView { prefix: Arc::from(c.prefix()), status: c.status() })
            .collect();
        let session = WatchSession::new(env.config.clone(), views, env.clock.now());
        let leader = requires_leader(&md).then(|| WatchStream::new(env.upstream.watch_no_leader()));
        let outages_at_open = Some(env.upstream.outages());
        let d = Driver {
            env: env.clone(),
            md,
            session_id: SessionId::next(),
            cache_tx,
            relay_tx: None,
            perm_tx: None,
            new_relay_rx: None,
            new_perm_rx: None,
            relays: HashMap::default(),
            pending: Pending::default(),
            watch_gauge: 0,
            owed: HashMap::default(),
            delivered: 0,
            end: None,
        };
        env.metrics.grpc_stream(1);
        let shutdown = WatchStream::from_changes(env.shutdown.clone());
        SessionDriver {
            env,
            session,
            d,
            inbound,
            inbound_open: true,
            cache_rx,
            relay_rx: None,
            perm_rx: None,
            statuses,
            outages_at_open,
            shutdown,
            leader,
            timer: None,
            end: None,
            ended: false,
        }
    }

    /// Runs the session as far as it can without waiting, and no more: for a stream's start,
    /// so that the first requests (sent with the call's headers) are under way before HTTP/2
    /// gives the response body its first send capacity, which takes a turn of the connection.
    pub fn poll_start(&mut self, cx: &mut Context<'_>) {
        if !self.ended {
            self.take_inputs(cx, PENDING_BYTES);
        }
    }

    /// Runs the session as far as it can without waiting, then hands what it answered to
    /// `emit`, in order, up to about `max_bytes` (at least one response), each with the bytes
    /// still waiting before it was taken (its own included: for sizing a buffer); the credit of
    /// what is handed out goes back to the caches. `Ready(Ok(()))`: something was handed out;
    /// `Ready(Err(status))`: the stream ends with `status` (once, after everything before it);
    /// `Pending`: nothing yet (every source it waits on will wake the task).
    pub fn poll_responses(
        &mut self,
        cx: &mut Context<'_>,
        max_bytes: usize,
        mut emit: impl FnMut(Response, usize),
    ) -> Poll<Result<(), Status>> {
        if !self.ended {
            self.take_inputs(cx, max_bytes);
        }
        if !self.d.pending.items.is_empty() {
            let mut bytes = 0;
            loop {
                let waiting = self.d.pending.bytes;
                let Some(r) = self.d.pending.pop_front() else { break };
                bytes += response_size(&r);
                if let Response::Events(e) = &r {
                    if let Some(c) = e.credit {
                        self.d.give_back(c);
                    }
                }
                emit(r, waiting);
                if bytes >= max_bytes {
                    break;
                }
            }
            self.d.pending.release();
            return Poll::Ready(Ok(()));
        }
        match self.end.take() {
            Some(status) => Poll::Ready(Err(status)),
            None => Poll::Pending,
        }
    }

    /// Takes in what is ready (the client's requests, the caches' messages, relayed responses
    /// while there is room for them, permission decisions, the session's deadline, the host's
    /// shutdown) until nothing is, the stream ends, or `max_bytes` of responses wait.
    fn take_inputs(&mut self, cx: &mut Context<'_>, max_bytes: usize) {
        let clock = self.env.clock;
        let now = || clock.now();
        for _ in 0..INPUTS_PER_POLL {
            self.carry_out();
            if self.ended || self.d.pending.bytes >= max_bytes {
                return;
            }
            match Pin::new(&mut self.shutdown).poll_next(cx) {
                // Shutting down, or the host is gone.
                Poll::Ready(Some(true) | None) => {
                    self.finish(Status::unavailable("watchcache is shutting down"));
                    continue;
                }
                Poll::Ready(Some(false)) => continue,
                Poll::Pending => {}
            }
            if let Some(leader) = self.leader.as_mut() {
                match Pin::new(leader).poll_next(cx) {
                    // etcd's member has no leader: the stream ends as etcd ends a
                    // require-leader stream then (and refuses a new one).
                    Poll::Ready(Some(true)) => {
                        self.finish(no_leader_status());
                        continue;
                    }
                    Poll::Ready(Some(false)) => continue,
                    Poll::Ready(None) => self.leader = None,
                    Poll::Pending => {}
                }
            }
            // A request held behind an undecided create: the next is not read (as etcd's
            // recvLoop does not read while it checks a create), so the client is pushed back.
            if self.inbound_open && self.session.takes_requests() {
                match Pin::new(&mut self.inbound).poll_next(cx) {
                    Poll::Ready(Some(Ok(req))) => {
                        refresh(&mut self.session, &mut self.statuses);
                        self.session.handle_request(now(), req);
                        continue;
                    }
                    // The client closed its sending side: as etcd does, its watches go on
                    // until it cancels the call.
                    Poll::Ready(None) => {
                        self.inbound_open = false;
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        // A request etcd could not read ends the stream with etcd's error (a
                        // client that went away never sees it).
                        debug!(error = %e, "watch stream ended");
                        self.finish(e);
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            if let Poll::Ready(Some(msg)) = self.cache_rx.poll_recv(cx) {
                refresh(&mut self.session, &mut self.statuses);
                self.session.handle_cache(now(), msg);
                // Everything already queued goes together (one batch per wake-up).
                for _ in 0..64 {
                    match self.cache_rx.try_recv() {
                        Ok(msg) => self.session.handle_cache(now(), msg),
                        Err(_) => break,
                    }
                }
                continue;
            }
            // Relayed responses wait while the client is not reading (the relays then stop
            // reading etcd); cache messages are bounded by credit and always taken.
            if self.d.pending.has_room() {
                if let Some(Poll::Ready(Some((relay, ev)))) =
                    self.relay_rx.as_mut().map(|rx| rx.poll_recv(cx))
                {
                    // etcd ended a relay of a require-leader client for want of a leader: the
                    // client's stream ends as etcd's own would (the caches may not know yet:
                    // their reflectors may be on another member).
                    let leaderless = matches!(&ev, RelayEvent::Ended { error: Some(e), .. }
                        if e.contains(NO_LEADER));
                    if leaderless && self.leader.is_some() {
                        self.finish(no_leader_status());
                        continue;
                    }
                    refresh(&mut self.session, &mut self.statuses);
                    self.note_outage();
                    self.session.handle_relay(now(), relay, ev);
                    continue;
                }
            }
            if let Some(Poll::Ready(Some((token, decision)))) =
                self.perm_rx.as_mut().map(|rx| rx.poll_recv(cx))
            {
                refresh(&mut self.session, &mut self.statuses);
                self.note_outage();
                self.session.handle_permission(now(), token, decision);
                continue;
            }
            if self.poll_deadline(cx).is_ready() {
                refresh(&mut self.session, &mut self.statuses);
                self.session.handle_timeout(now());
                continue;
            }
            return;
        }
        // More input than one call takes: come back after the others had their turn.
        self.carry_out();
        cx.waker().wake_by_ref();
    }

    /// Waits for the session's next deadline (the timer is kept, and moved only when the
    /// deadline does).
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((t, _)) = self.session.poll_timeout() else {
            self.timer = None;
            return Poll::Pending;
        };
        let at = self.env.clock.instant_of(t);
        match &mut self.timer {
            Some((deadline, sleep)) => {
                if *deadline != at {
                    *deadline = at;
                    sleep.as_mut().reset(at);
                }
                sleep.as_mut().poll(cx)
            }
            None => {
                let mut sleep = Box::pin(tokio::time::sleep_until(at));
                let p = sleep.as_mut().poll(cx);
                self.timer = Some((at, sleep));
                p
            }
        }
    }

    /// Tells the session, once, that etcd broke the caches' own streams since this one opened
    /// (an etcd restart would have broken this one too, over etcd itself).
    fn note_outage(&mut self) {
        if let Some(at_open) = self.outages_at_open {
            if self.env.upstream.outages() > at_open {
                self.outages_at_open = None;
                self.session.handle_upstream_outage();
            }
        }
    }

    /// The stream ends with `status` once what is pending has gone.
    fn finish(&mut self, status: Status) {
        self.ended = true;
        self.end = Some(status);
    }

    /// Carries out the session's outputs and adopts the channels made meanwhile.
    fn carry_out(&mut self) {
        self.d.carry_out(&mut self.session);
        if let Some(status) = self.d.end.take() {
            debug!(%status, "the session ended the watch stream");
            self.finish(status);
        }
        if let Some(rx) = self.d.new_relay_rx.take() {
            self.relay_rx = Some(rx);
        }
        if let Some(rx) = self.d.new_perm_rx.take() {
            self.perm_rx = Some(rx);
        }
    }
}

impl<S> Drop for SessionDriver<S> {
    /// The client went away or the stream ended: its watches end (cache watches cancelled,
    /// relays closed) and the gauges come down.
    fn drop(&mut self) {
        self.session.close();
        self.d.carry_out(&mut self.session);
        self.env.metrics.grpc_watcher(-self.d.watch_gauge);
        self.env.metrics.grpc_stream(-1);
    }
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
    /// Events handed to the transport since the shared counter was last added to.
    delivered: u64,
    /// The session ended the stream with this status.
    end: Option<Status>,
}

impl Driver {
    fn relay_sender(&mut self) -> mpsc::Sender<(RelayId, RelayEvent)> {
        if let Some(tx) = &self.relay_tx {
            return tx.clone();
        }
        // A few responses ahead at most: each may be as large as etcd makes it (a catch-up
        // of up to 1 000 revisions), and a client that stops reading stops its relays here.
        let (tx, rx) = mpsc::channel(RELAYED_AHEAD);
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
        // The shared counters are written once per carry-out, and only on a change (an atomic
        // add, even of zero, takes the counter's cache line from the other worker thread).
        if self.delivered > 0 {
            self.env.metrics.add_delivered(std::mem::take(&mut self.delivered));
        }
        let n = session.watch_count() as i64;
        if n != self.watch_gauge {
            self.env.metrics.grpc_watcher(n - self.watch_gauge);
            self.watch_gauge = n;
        }
    }

    fn one(&mut self, o: SessionOutput, feedback: &mut Vec<Feedback>) {
        if let SessionOutput::Upstream(UpstreamCmd::Open { relay, request, permitted }) = o {
            let tx = self.relay_sender();
            let (ctl, ctl_rx) = mpsc::unbounded_channel();
            self.relays.insert(relay, ctl);
            self.env.metrics.count_upstream_request("watch");
            let md = self.md.clone();
            tokio::spawn(run_relay(self.env.clone(), md, request, permitted, relay, tx, ctl_rx));
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
                        self.delivered += e.picks.len() as u64;
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
            SessionOutput::End(reason) => self.end = Some(Status::unavailable(reason)),
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
    env: Arc<SessionEnv>,
    md: MetadataMap,
    request: PbWatchRequest,
    permitted: bool,
    id: RelayId,
    tx: mpsc::Sender<(RelayId, RelayEvent)>,
    mut ctl: mpsc::UnboundedReceiver<RelayCtl>,
) {
    let (upstream, metrics) = (&env.upstream, &env.metrics);
    let pause_after = Duration::from_millis(env.config.relay_pause_ms);
    let opened = tokio::select! {
        o = open_relay_watch(&env, &md, request, permitted) => o,
        // Closed by the session before etcd answered.
        None = ctl.recv() => return,
    };
    let (mut up_tx, mut stream, mut first) = match opened {
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
    let gauge = UpstreamWatchGauge::open(metrics);
    // On a connection that other calls share (a library cache's, over its user's client), a
    // relay does not leave etcd's responses unread in the connection's window while the session
    // is behind: it ends its etcd watch and the session takes the watch up later (see
    // `RelayEvent::Paused`) once it has waited `pause_after` for room: a reader that takes a
    // response at least that often never pauses (each pause costs etcd a watch, which catches
    // up again from the last revision delivered). On the server's relays' connection, a
    // stalled relay holds only its own stream's window, as a slow client of etcd does.
    let pause_when_full = upstream.relays_share_a_connection();
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
            m = next_response(&mut stream, &mut first) => {
                let ev = match m {
                    Ok(Some(r)) => RelayEvent::Response(Box::new(r)),
                    Ok(None) => RelayEvent::Ended { error: Some("etcd closed the watch stream".into()), unavailable: true },
                    Err(s) => RelayEvent::Ended { error: Some(go_status_string(&s)), unavailable: !is_refusal(&s) },
                };
                let end = matches!(ev, RelayEvent::Ended { .. });
                if pause_when_full && !end {
                    let room = tokio::select! {
                        r = tokio::time::timeout(pause_after, tx.reserve()) => r,
                        // Closed by the session meanwhile.
                        None = ctl.recv() => return,
                    };
                    match room {
                        Ok(Ok(permit)) => {
                            permit.send((id, ev));
                            continue;
                        }
                        Ok(Err(_)) => return,
                        Err(_) => {
                            // The etcd watch ends here (its stream is reset, and what etcd
                            // sent into it is released); the response in hand goes over once
                            // the session has room, then the pause.
                            drop((stream, up_tx, gauge));
                            if tx.send((id, ev)).await.is_ok() {
                                let _ = tx.send((id, RelayEvent::Paused)).await;
                            }
                            return;
                        }
                    }
                }
                if tx.send((id, ev)).await.is_err() || end {
                    return;
                }
            }
        }
    }
}

/// Opens a relay's etcd watch. A watch etcd already permitted to the client is opened with the
/// cache's own credentials when it has some (etcd checks a watch's permission once, at its
/// creation; the client's token may have expired or been forgotten by an etcd restart since,
/// and the client, whose stream never broke, would not know to authenticate again). If etcd
/// refuses the cache's token as expired, the cache authenticates again and opens it once more:
/// the watch, and etcd's first response if it was read for that.
async fn open_relay_watch(
    env: &SessionEnv,
    md: &MetadataMap,
    request: PbWatchRequest,
    permitted: bool,
) -> Result<(UpWatchTx, UpWatchRx, Option<PbWatchResponse>), Status> {
    let upstream = &env.upstream;
    if !permitted || !upstream.has_credentials() {
        let (tx, rx) = upstream.open_watch(md, request).await?;
        return Ok((tx, rx, None));
    }
    let mut refused = None;
    loop {
        let Some(token) = upstream.own_token(refused.as_deref()).await? else {
            // etcd has auth off: it reads no token.
            let (tx, rx) = upstream.open_watch(md, request).await?;
            return Ok((tx, rx, None));
        };
        let (tx, mut rx) = upstream.open_watch(&with_token(md, &token), request.clone()).await?;
        let first = rx.message().await?;
        match &first {
            Some(r) if r.canceled && is_token_refusal(&r.cancel_reason) && refused.is_none() => {
                env.metrics.count_upstream_request("watch");
                refused = Some(token);
            }
            _ => return Ok((tx, rx, first)),
        }
    }
}

/// The client's metadata with the cache's token in place of the client's.
fn with_token(md: &MetadataMap, token: &str) -> MetadataMap {
    let mut md = md.clone();
    md.remove("authorization");
    if let Ok(v) = token.parse() {
        md.insert("token", v);
    }
    md
}

/// A relay's next response from etcd: the one read when it was opened, if any, first.
async fn next_response(
    stream: &mut UpWatchRx,
    first: &mut Option<PbWatchResponse>,
) -> Result<Option<PbWatchResponse>, Status> {
    match first.take() {
        Some(r) => Ok(Some(r)),
        None => stream.message().await,
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
        let mut pending = Pending::default();
        for r in [relayed(PENDING_BYTES + 100_000), relayed(10), relayed(0)] {
            pending.push_back(r);
        }
        assert!(!pending.has_room());
        // The big one goes first, then the rest.
        assert!(pending.pop_front().is_some());
        assert_eq!(pending.items.len(), 2);
        assert_eq!(pending.bytes, pending.items.iter().map(budget_size).sum::<usize>());
        while pending.pop_front().is_some() {}
        assert_eq!(pending.bytes, 0, "nothing pending, nothing counted");
        assert!(pending.has_room(), "relayed input is taken again");
    }

    #[test]
    fn an_emptied_queue_is_given_back_and_the_next_burst_reserves_the_last_ones_size() {
        let mut pending = Pending::default();
        for _ in 0..20 {
            pending.push_back(relayed(10));
        }
        while pending.pop_front().is_some() {}
        pending.release();
        assert_eq!(pending.items.capacity(), 0, "an idle stream holds no queue");
        pending.push_back(relayed(10));
        let reserved = pending.items.capacity();
        assert!(reserved >= 20, "reserved {reserved}");
        for _ in 1..20 {
            pending.push_back(relayed(10));
        }
        assert_eq!(pending.items.capacity(), reserved, "the burst fit in what it reserved");
        // A queue that is not empty is kept.
        pending.release();
        assert_eq!(pending.items.len(), 20);
    }
}
