//! etcd's `Watch` stream as a sans-IO state machine: one session per client stream, many
//! watches per session, each served from a cache where etcd's semantics allow and from its own
//! etcd watch (a *relay*) otherwise, moving between the two without the client noticing.
//!
//! Like the core (and quinn-proto, str0m), [`WatchSession`] does no I/O and reads no clock:
//! - **inputs** `handle_*`: a client request, a cache's message, a relay's response or end, a
//!   permission decision, a cache's status, an outage of etcd seen by the caches, and
//!   [`WatchSession::handle_timeout`];
//! - **outputs** [`WatchSession::poll_output`], drained after every input: responses for the
//!   client, commands for the caches, relays to open, ask or close, permission checks, and the
//!   stream's end (when etcd forgot the client's token, as a restart would have ended it);
//! - [`WatchSession::poll_timeout`] says when to call `handle_timeout` and why.
//!
//! `driver.rs` runs it on tokio; `tests.rs` runs it with a fake cache and a fake etcd.
//!
//! etcd's guarantees it keeps, per watch (spec/etcd.md 1.6): **ordered** and **unique** (a watch's
//! revisions only go up: what came from one source is never sent again by the next, which resumes
//! after the last revision delivered), **reliable** and **resumable** (a watch that leaves a source
//! resumes from the next revision, from the cache if its window holds it, else from etcd),
//! **atomic** (responses hold whole revisions), **bookmarkable** (a progress answer at R comes only
//! once every watch on the stream has been given every event up to R, and never below a revision
//! the stream has already vouched for; none at all while the stream holds a watch etcd ended as
//! compacted and the client has not canceled). And etcd's rules for the stream: requests taken in
//! order, one at a time where a create's outcome decides the next one's id (etcd's `recvLoop`);
//! `created` responses in request order; watch ids never reused (etcd's `watchStream.nextID` only
//! goes up), a refused create takes none (`-1`), an id the client canceled is free for the next
//! create at once (one that needs it waits for a cancel still queued behind its watch's `created`),
//! `created` carries the newest revision known (also for a start in the future), and a watch etcd
//! ended (compacted) keeps its id until the client cancels it (etcd's `watchStream` holds it until
//! then: a create with that id is a duplicate, the cancel is answered); events of a watch only
//! after its `created`; with auth on, a create's permission checked before its range and its id.
//!
//! etcd counterparts: `server/etcdserver/api/v3rpc/watch.go` (`serverWatchStream`: recvLoop,
//! sendLoop, ids, created/canceled, progress), `server/storage/mvcc/watcher.go` (ids),
//! `server/proxy/grpcproxy/watch.go` (what a proxy must add: progress answered, not dropped).

pub mod driver;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use cacher_core::{CloseCause, KeyRange, RequestId, Timestamp};
use etcd_client::proto::{PbResponseHeader, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use rustc_hash::FxHashMap as HashMap;

use crate::cache::delivery::{CacheMsg, EventRun, Picks, WatchTag};
use crate::cache::CacheStatus;
use crate::convert::{FILTER_NODELETE, FILTER_NOPUT};
use crate::keys::{etcd_range, range_within_prefix, watch_key_range};

/// How many times a query asks its relays again for an answer below the caches' (at most a
/// relay's earlier requests are still answered before its latest).
const STALE_REASKS: u32 = 3;

/// `mvcc.ErrWatcherDuplicateID`.
pub const ERR_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// `mvcc.ErrEmptyWatcherRange`.
pub const ERR_EMPTY_RANGE: &str = "mvcc: watcher range is empty";
pub use crate::upstream::ERR_INVALID_AUTH_TOKEN;
/// Why the session ends a stream whose token etcd forgot.
pub const END_FORGOTTEN_TOKEN: &str = "watchcache: etcd no longer knows this stream's auth \
    token (etcd restarted, or the token expired): connect again to authenticate";
/// `mvcc.ErrCompacted`, as the watch server words it.
pub const ERR_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// A session's settings.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Idle watches that asked for progress notify get one this often.
    pub progress_notify_interval_ms: u64,
    /// How often a relayed watch checks whether it can move back onto its cache.
    pub rejoin_interval_ms: u64,
    /// How long a new watch waits for its cache to become ready.
    pub create_wait_ms: u64,
    /// How long a create sent to etcd waits for etcd's answer before the session announces the
    /// watch itself (etcd unreachable) and keeps trying.
    pub upstream_create_wait_ms: u64,
    /// Credit is returned to a cache once this many events are owed (the driver batches it).
    pub credit_batch: u64,
    /// Largest response built from cached events (whole revisions are never split; a single
    /// revision larger than this goes whole).
    pub max_response_bytes: usize,
    /// A watch created with `fragment` gets a response of this many bytes or more (with two
    /// events or more) as fragments, each below it: what etcd fragments at (`v3rpc/watch.go`,
    /// `sendFragments`), its `--max-request-bytes` with the 512 KiB it allows for gRPC's
    /// overhead (`MaxRequestBytesWithOverhead`), 2 MiB by default (from
    /// [`crate::config::CacheConfig::max_request_bytes`]).
    pub fragment_bytes: usize,
    /// Ask before serving a cached watch whether the client may read its range (etcd auth).
    pub check_permissions: bool,
    /// Retry delay of an unanswered progress request.
    pub progress_retry_ms: u64,
    /// First and longest wait before a relay that broke is tried again.
    pub backoff_min_ms: u64,
    /// See `backoff_min_ms`.
    pub backoff_max_ms: u64,
    /// How long a relay on a connection that other calls share (a library cache's) waits for
    /// room in its session before it pauses (`RelayEvent::Paused`).
    pub relay_pause_ms: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            progress_notify_interval_ms: 600_000,
            rejoin_interval_ms: 1_000,
            create_wait_ms: 5_000,
            upstream_create_wait_ms: 1_000,
            credit_batch: 256,
            max_response_bytes: 1 << 20,
            fragment_bytes: crate::config::ETCD_MAX_REQUEST_BYTES
                + crate::config::ETCD_GRPC_OVERHEAD_BYTES,
            check_permissions: false,
            progress_retry_ms: 100,
            backoff_min_ms: 100,
            backoff_max_ms: 2_000,
            relay_pause_ms: 1_000,
        }
    }
}

/// A relay: one etcd watch stream opened for one of the session's watches, numbered by the
/// session (never reused within it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelayId(pub u64);

/// What a relay reports.
#[derive(Debug)]
pub enum RelayEvent {
    /// A response from etcd (the first one answers the create).
    Response(Box<PbWatchResponse>),
    /// The relay's etcd stream ended or could not be opened.
    Ended {
        /// etcd's error, if any.
        error: Option<String>,
        /// True if etcd could not be reached (try again later); false if etcd refused.
        unavailable: bool,
    },
    /// The relay stopped reading etcd because the session was behind, and ended its etcd watch
    /// (a relay on a connection other calls share: its unread responses would otherwise fill
    /// the connection's HTTP/2 window and hold up every call on it). Every response before this
    /// one was handed over; what etcd sent after them is gone. The session takes the watch up
    /// again after the last revision it delivered.
    Paused,
}

/// A permission decision for a cached watch.
#[derive(Debug)]
pub enum Permission {
    /// etcd lets the client read the range.
    Allowed,
    /// etcd refused: the reason, as etcd's watch server writes it into `cancel_reason`.
    Denied(String),
    /// etcd could not be asked: etcd decides, through a relay.
    Unknown,
}

/// A cached watch's events for the client: whole revisions.
#[derive(Clone, Debug)]
pub struct EventsResponse {
    /// The client's watch id.
    pub watch_id: i64,
    /// The response header (its revision at least the last event's; the host fills in etcd's
    /// cluster and member ids).
    pub header: PbResponseHeader,
    /// The events' run (shared).
    pub run: Arc<EventRun>,
    /// Which of the run's events.
    pub picks: Picks,
    /// With previous values.
    pub prev_kv: bool,
    /// A fragment of a larger response, more to come (a watch created with `fragment`).
    pub fragment: bool,
    /// Roughly its size on the wire (for the byte budgets).
    pub size: usize,
    /// Credit to give back to the cache once the transport has taken this response (so a
    /// client that stops reading stops its cache watchers, which then fall behind into the
    /// ring instead of piling up here).
    pub credit: Option<Credit>,
}

/// Credit a cache gave for events now on their way to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    /// The cache's index.
    pub cache: usize,
    /// The core's watch.
    pub watch: RequestId,
    /// Events.
    pub n: u64,
}

/// A response for the client.
#[derive(Clone, Debug)]
pub enum Response {
    /// A typed response: created, canceled, progress, or relayed from etcd.
    Message(PbWatchResponse),
    /// Cached events.
    Events(EventsResponse),
}

/// What a session asks of a cache.
#[derive(Debug)]
pub enum CacheCmd {
    /// Serve a watch (the answer is a `Started` or `Refused` message).
    Start {
        /// The attempt.
        tag: WatchTag,
        /// The keys.
        range: KeyRange,
        /// Inclusive start revision, 0 = from the cache's revision.
        start_rev: u64,
        /// How long to wait for the ready gate.
        wait_ready_ms: u64,
    },
    /// End a watch.
    Cancel {
        /// The core's watch.
        watch: RequestId,
    },
    /// Give a watch room for `n` more events.
    Credit {
        /// The core's watch.
        watch: RequestId,
        /// Events.
        n: u64,
    },
    /// Which of these watches have everything up to the cache's revision?
    Frontier {
        /// The query.
        token: u64,
        /// The watches.
        watches: Vec<(WatchTag, RequestId)>,
        /// Answer only once the cache has caught up with etcd's current revision (a client's
        /// progress request: etcd answers it at its current revision).
        fresh: bool,
    },
    /// Ask etcd for progress on the cache's own watch (its revision then catches up with etcd's).
    RequestProgress,
}

/// What a session asks of etcd.
#[derive(Debug)]
pub enum UpstreamCmd {
    /// Open a relay: an etcd watch stream with this create request.
    Open {
        /// The relay.
        relay: RelayId,
        /// The create request (the client's, with the start revision to resume from).
        request: PbWatchRequest,
        /// The watch was already permitted to the client (see `Watch::permitted`): the relay
        /// is opened with the cache's own credentials.
        permitted: bool,
    },
    /// Send a progress request on the relay's stream.
    Progress {
        /// The relay.
        relay: RelayId,
    },
    /// Close the relay.
    Close {
        /// The relay.
        relay: RelayId,
    },
}

/// Something worth counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// A watch started on a cache.
    ServedFromCache,
    /// A watch went to etcd (a relay was opened for it).
    ServedFromEtcd,
    /// A relayed watch moved back onto its cache.
    Rejoined,
    /// etcd said it compacted at this revision.
    Compacted(u64),
}

/// Everything a session asks for, in order.
#[derive(Debug)]
pub enum SessionOutput {
    /// Send to the client.
    Respond(Response),
    /// A command for cache `cache`.
    Cache {
        /// The cache's index.
        cache: usize,
        /// The command.
        cmd: CacheCmd,
    },
    /// A relay to open, ask or close.
    Upstream(UpstreamCmd),
    /// Decide whether the client may read `[key, range_end)`; answer with
    /// [`WatchSession::handle_permission`].
    CheckPermission {
        /// The decision's token.
        token: u64,
        /// The watch's key.
        key: Vec<u8>,
        /// The watch's range end.
        range_end: Vec<u8>,
    },
    /// For the metrics.
    Note(Note),
    /// End the stream as a broken one (gRPC `Unavailable`, with this message), after every
    /// response already handed out.
    End(String),
}

/// Why the next timeout is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerReason {
    /// Periodic progress notifications for idle watches.
    ProgressTick,
    /// A progress request that could not be answered yet is tried again.
    ProgressRetry,
    /// Relayed watches check whether they can move back onto their cache.
    Rejoin,
    /// A relay that broke is tried again.
    Resume,
    /// etcd has not answered a create: the session announces the watch itself.
    AnnounceCreate,
    /// A permission etcd could not be asked for is asked again.
    Permission,
}

/// What the session knows of a cache: its prefix (for routing) and its last status.
#[derive(Clone, Debug)]
pub struct CacheView {
    /// The cached prefix.
    pub prefix: Arc<[u8]>,
    /// Its status as last published.
    pub status: CacheStatus,
}

/// A watch as the client created it (its keys once, as the core's range: etcd's key and
/// range end are derived from it when a relay needs them).
#[derive(Clone, Debug)]
struct CreateSpec {
    range: KeyRange,
    start_revision: i64,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    no_put: bool,
    no_delete: bool,
}

impl CreateSpec {
    /// etcd's `filters` for the watch.
    fn filters(&self) -> Vec<i32> {
        let mut f = Vec::new();
        if self.no_put {
            f.push(FILTER_NOPUT);
        }
        if self.no_delete {
            f.push(FILTER_NODELETE);
        }
        f
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Waiting for a permission decision.
    Authorizing { token: u64 },
    /// Asked a cache to serve it.
    CacheStarting { cache: usize, tag: WatchTag },
    /// Served by a cache.
    Cache { cache: usize, tag: WatchTag, core: RequestId },
    /// A relay was opened; etcd has not answered yet.
    RelayOpening { relay: RelayId, since: Timestamp },
    /// Served by a relay.
    Relay { relay: RelayId },
    /// Between sources, until this time.
    Waiting { until: Timestamp },
    /// No source (not started yet, or ending).
    Idle,
}

#[derive(Debug)]
struct Watch {
    spec: CreateSpec,
    /// The cache whose prefix holds every key of the watch, if any.
    cache: Option<usize>,
    source: Source,
    /// Every event up to this revision has been given to the client (or filtered out for
    /// it): a new source resumes after it.
    delivered: u64,
    /// The highest revision a response on this watch has vouched for (event or progress).
    vouched: u64,
    /// Events below this revision are never sent (the start revision).
    min_rev: u64,
    /// The start revision the client asked for (0: now). etcd sends no progress notification,
    /// periodic or requested, below it (`progressIfSync`: `rev < w.startRev`).
    start_rev: u64,
    /// Started from "now" and the revision of "now" is not known yet.
    from_now: bool,
    /// `created` has been sent.
    announced: bool,
    /// The `created` response to send when its turn comes.
    created: Option<Box<PbWatchResponse>>,
    /// etcd ended it before it was announced: it ends once announced (the cancel is held).
    doomed: bool,
    /// Its id was the session's choice (the client asked for none): the next automatic id
    /// before the search for a free one, where a refusal puts it back.
    auto_from: Option<i64>,
    /// etcd (a relay's `created`) or the permission check let the client have it: as etcd
    /// checks a watch's permission once, at its creation, a relay that takes it up later is
    /// opened as the cache itself ([`UpstreamCmd::Open`]'s `permitted`), not with the
    /// client's token, which etcd may have forgotten since.
    permitted: bool,
    /// Responses held until `created` has gone out.
    held: Vec<Response>,
    events_since_tick: bool,
    /// A periodic progress notification is due once its frontier is known.
    periodic_due: bool,
    /// Failed relay attempts in a row.
    failures: u32,
    /// The fragments of a relayed response whose last fragment has not come yet, and the relay
    /// they came from.
    fragments: Option<(RelayId, Vec<PbWatchResponse>)>,
}

enum Announce {
    /// A watch's `created`, when known.
    Watch(i64),
    /// A response that must keep its place among the `created` responses.
    Ready(PbWatchResponse),
    /// The client's cancel of a watch not yet announced: answered in its place, after that
    /// watch's `created` and before what the client asked after it.
    Cancel(i64),
}

/// A create etcd's watch store refuses, whose permission etcd has yet to decide.
struct Rejecting {
    /// The permission check out, if one is.
    token: Option<u64>,
    /// The refusal it gets if the client may read the range.
    reason: &'static str,
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// etcd could not be asked: when to ask again.
    retry_at: Option<Timestamp>,
    failures: u32,
}

struct Query {
    started: Timestamp,
    /// The caches asked, by the token of their question.
    caches: BTreeMap<u64, usize>,
    relays: BTreeSet<RelayId>,
    /// Each watch's frontier: every event up to it has been given to the client.
    frontiers: BTreeMap<i64, u64>,
    /// Some watch has no frontier (between sources, or not caught up).
    blocked: bool,
    /// The watch set when the query started (a watch created since invalidates it).
    epoch: u64,
    /// The highest revision a cache answered with: caches answer once they have reached
    /// etcd's revision at the question (a fresh frontier), so no answer may be below it.
    floor: u64,
    /// Relays asked again for an answer below the floor. Bounded: a relay on an etcd member
    /// that lags the cache's answers below it for good, and the stream is answered then.
    reasked: u32,
}

/// One client watch stream. See the module docs.
pub struct WatchSession {
    cfg: SessionConfig,
    caches: Vec<CacheView>,
    watches: BTreeMap<i64, Watch>,
    by_tag: HashMap<WatchTag, i64>,
    /// The cache each pending start was sent to.
    tag_cache: HashMap<WatchTag, usize>,
    by_relay: HashMap<RelayId, i64>,
    by_permission: HashMap<u64, i64>,
    next_auto_id: i64,
    /// Ids of watches etcd ended (compacted), still held until the client cancels them.
    ended: BTreeSet<i64>,
    /// Requests not taken yet: they wait while a create's outcome is unknown (`undecided`).
    requests: VecDeque<PbWatchRequest>,
    /// The last create whose outcome (an id, or a refusal that takes none) was not yet known
    /// when it was taken.
    undecided: Option<i64>,
    /// A create refused for its range or id, waiting for its permission check.
    rejecting: Option<Rejecting>,
    /// etcd took the client's token on this stream (a permission allowed, a relay created).
    token_taken: bool,
    /// etcd broke the caches' own streams since this one opened (`handle_upstream_outage`).
    outlived_outage: bool,
    /// The session asked for the stream to end.
    ending: bool,
    next_tag: u64,
    next_relay: u64,
    next_token: u64,
    /// Bumped whenever a watch is created.
    epoch: u64,
    announce: VecDeque<Announce>,
    outputs: VecDeque<SessionOutput>,
    /// A client asked for progress and has not been answered.
    progress_wanted: bool,
    /// A client asked for progress again while a query was out: that query's frontiers are
    /// older than the request, so a new query follows it (etcd answers at its revision when
    /// it answers, never below a request's).
    progress_again: bool,
    query: Option<Query>,
    progress_retry_at: Option<Timestamp>,
    /// The last `watch_id = -1` progress answer's revision.
    stream_progress: u64,
    /// The periodic tick's questions to caches, while out.
    periodic_tokens: BTreeSet<u64>,
    next_tick: Timestamp,
    next_rejoin: Timestamp,
    /// The highest revision seen from etcd or a cache (for headers of the session's own
    /// responses).
    best_rev: u64,
    now: Timestamp,
}

impl WatchSession {
    /// A session over `caches` (in the order the host numbers them), starting at `now`.
    pub fn new(cfg: SessionConfig, caches: Vec<CacheView>, now: Timestamp) -> WatchSession {
        let best_rev = caches.iter().map(|c| c.status.rv).max().unwrap_or(0);
        let next_tick = now.add_ms(cfg.progress_notify_interval_ms.max(1));
        let next_rejoin = now.add_ms(cfg.rejoin_interval_ms.max(1));
        WatchSession {
            cfg,
            caches,
            watches: BTreeMap::new(),
            by_tag: HashMap::default(),
            tag_cache: HashMap::default(),
            by_relay: HashMap::default(),
            by_permission: HashMap::default(),
            next_auto_id: 0,
            ended: BTreeSet::new(),
            requests: VecDeque::new(),
            undecided: None,
            rejecting: None,
            token_taken: false,
            outlived_outage: false,
            ending: false,
            next_tag: 1,
            next_relay: 1,
            next_token: 1,
            epoch: 0,
            announce: VecDeque::new(),
            outputs: VecDeque::new(),
            progress_wanted: false,
            progress_again: false,
            query: None,
            progress_retry_at: None,
            stream_progress: 0,
            periodic_tokens: BTreeSet::new(),
            next_tick,
            next_rejoin,
            best_rev,
            now,
        }
    }

    // ----- inputs -----------------------------------------------------------------------------

    /// A request from the client.
    pub fn handle_request(&mut self, now: Timestamp, req: PbWatchRequest) {
        self.advance(now);
        self.requests.push_back(req);
        self.take_requests();
    }

    /// Takes the client's requests in order, while no create waits for an outcome that decides
    /// the next id (etcd's `recvLoop` checks a create's permission before it reads the next
    /// request: a refused create takes no id).
    fn take_requests(&mut self) {
        loop {
            while self.takes_next() {
                let Some(req) = self.requests.pop_front() else { break };
                self.take_request(req);
            }
            self.flush_announcements();
            // The announcements may have answered the cancel the next create waited for.
            if self.requests.is_empty() || !self.takes_next() {
                break;
            }
        }
        if self.requests.is_empty() {
            release(&mut self.requests);
        }
    }

    /// Whether the next request may be taken: no create is undecided, and the next is not a
    /// create whose id depends on a cancel still waiting for its watch's announcement (etcd
    /// frees a canceled id before it reads the next request; here the watch holds its id until
    /// its `created` and then its cancel have gone out).
    fn takes_next(&self) -> bool {
        if self.deciding() {
            return false;
        }
        let Some(PbWatchRequest { request_union: Some(PbWatchRequestUnion::CreateRequest(c)) }) =
            self.requests.front()
        else {
            return true;
        };
        let cancel_waits =
            |id: i64| self.announce.iter().any(|a| matches!(a, Announce::Cancel(x) if *x == id));
        if c.watch_id != 0 {
            return !cancel_waits(c.watch_id);
        }
        // An automatic id skips the ids in use from the next one on: it waits if one of those
        // is a canceled one etcd would have freed.
        !(self.next_auto_id..self.free_auto_id()).any(cancel_waits)
    }

    /// Whether a watch holds `id` on the stream (open, or ended by etcd and not yet canceled).
    fn id_in_use(&self, id: i64) -> bool {
        self.watches.contains_key(&id) || self.ended.contains(&id)
    }

    /// Whether the stream holds a watch etcd ended (compacted) that the client has not canceled
    /// yet, or one it is ending before it was announced. etcd's `progressIfSync` finds such a
    /// watcher in neither of its groups and drops every progress request until the client
    /// cancels it (clientv3 does once it hands the compacted response to its reader).
    fn holds_compacted(&self) -> bool {
        !self.ended.is_empty() || self.watches.values().any(|w| w.doomed)
    }

    /// The id an automatic create gets: the first from the next one on that no watch holds.
    fn free_auto_id(&self) -> i64 {
        let mut id = self.next_auto_id;
        while self.id_in_use(id) {
            id += 1;
        }
        id
    }

    /// Whether the session takes another request now (none is held behind an undecided
    /// create); a driver that stops reading meanwhile pushes back on the client.
    pub fn takes_requests(&self) -> bool {
        self.requests.is_empty()
    }

    /// Whether the last create taken may still be refused (its permission check is out, or
    /// etcd has not answered its relay yet).
    fn deciding(&self) -> bool {
        if self.rejecting.is_some() {
            return true;
        }
        let Some(id) = self.undecided else { return false };
        // A create etcd serves can be refused by etcd (its user may not read the range), which
        // leaves etcd's next automatic id where it was: without permission checks of the
        // session's own (a library cache), the next request waits for etcd's answer too.
        self.watches.get(&id).is_some_and(|w| {
            !w.announced
                && w.created.is_none()
                && (matches!(w.source, Source::Authorizing { .. } | Source::RelayOpening { .. })
                    || self.awaits_permission(w))
        })
    }

    /// Whether etcd has yet to let the client read the watch's range (with permissions
    /// checked): until then the watch is neither announced by the session nor served from a
    /// cache, whatever happens to etcd meanwhile.
    fn awaits_permission(&self, w: &Watch) -> bool {
        self.cfg.check_permissions && !w.permitted
    }

    /// Whether the session may answer `created` for the watch itself, should etcd not answer
    /// in time: not yet announced, and not waiting for etcd's permission.
    fn may_announce_self(&self, w: &Watch) -> bool {
        !w.announced && w.created.is_none() && !self.awaits_permission(w)
    }

    fn take_request(&mut self, req: PbWatchRequest) {
        match req.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                // etcd's order of checks (`v3rpc/watch.go`, then `watchStream.Watch`): a
                // negative start, the permission, the range, then the id.
                if c.start_revision < 0 {
                    self.reject_create(-1, ERR_COMPACTED);
                } else if let Ok(range) = watch_key_range(&c.key, &c.range_end) {
                    let spec = CreateSpec {
                        range,
                        start_revision: c.start_revision,
                        prev_kv: c.prev_kv,
                        progress_notify: c.progress_notify,
                        fragment: c.fragment,
                        no_put: c.filters.contains(&FILTER_NOPUT),
                        no_delete: c.filters.contains(&FILTER_NODELETE),
                    };
                    self.create(spec, c.watch_id);
                } else {
                    // etcd reads an empty key as "\0" before it checks the permission.
                    let key = if c.key.is_empty() { vec![0] } else { c.key };
                    self.reject_create_checked(key, c.range_end, ERR_EMPTY_RANGE);
                }
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => self.client_cancel(c.watch_id),
            // etcd answers for a stream's watchers (`progressIfSync`): none, no answer; and
            // none while it holds a watcher it ended as compacted (never synced again).
            Some(PbWatchRequestUnion::ProgressRequest(_))
                if self.watches.is_empty() || self.holds_compacted() => {}
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                self.progress_wanted = true;
                if self.query.is_none() {
                    self.start_query();
                } else {
                    self.progress_again = true;
                }
            }
            // etcd ignores request types it does not know.
            None => {}
        }
        self.flush_announcements();
    }

    /// A message from a cache.
    pub fn handle_cache(&mut self, now: Timestamp, msg: CacheMsg) {
        self.advance(now);
        match msg {
            CacheMsg::Started { tag, watch, after_rev, cache_rv } => {
                self.best_rev = self.best_rev.max(cache_rv);
                self.on_cache_started(tag, watch, after_rev)
            }
            CacheMsg::Refused { tag, reason } => self.on_cache_refused(tag, &reason),
            CacheMsg::Events { run, items } => {
                self.best_rev = self.best_rev.max(run.header_rev());
                for item in items {
                    self.on_cache_events(&run, item.tag, &item.picks);
                }
            }
            CacheMsg::Closed { tag, cause, .. } => self.on_cache_closed(tag, cause),
            CacheMsg::Frontier { token, cache_rv, caught_up } => {
                self.best_rev = self.best_rev.max(cache_rv);
                self.on_frontier(token, cache_rv, caught_up)
            }
        }
        self.take_requests();
    }

    /// A relay's response or end.
    pub fn handle_relay(&mut self, now: Timestamp, relay: RelayId, ev: RelayEvent) {
        self.advance(now);
        let Some(&id) = self.by_relay.get(&relay) else { return };
        let current = self.watches.get(&id).is_some_and(|w| {
            matches!(w.source, Source::Relay { relay: r } | Source::RelayOpening { relay: r, .. } if r == relay)
        });
        if !current {
            self.by_relay.remove(&relay);
            return;
        }
        match ev {
            RelayEvent::Response(r) => {
                if let Some(h) = &r.header {
                    self.best_rev = self.best_rev.max(h.revision.max(0) as u64);
                }
                self.on_relay_response(id, relay, *r)
            }
            RelayEvent::Ended { error, unavailable } => {
                self.on_relay_ended(id, relay, error, unavailable)
            }
            RelayEvent::Paused => self.on_relay_paused(id, relay),
        }
        self.take_requests();
    }

    /// etcd broke the caches' own watches or lists since this stream opened: if etcd restarted,
    /// it forgot the tokens it had given, and it would have broken this stream too.
    pub fn handle_upstream_outage(&mut self) {
        self.outlived_outage = true;
    }

    /// The answer to [`SessionOutput::CheckPermission`].
    pub fn handle_permission(&mut self, now: Timestamp, token: u64, decision: Permission) {
        self.advance(now);
        match &decision {
            Permission::Allowed => self.token_taken = true,
            Permission::Denied(reason) if self.token_forgotten(reason) => return,
            _ => {}
        }
        if let Some(failures) =
            self.rejecting.as_ref().filter(|r| r.token == Some(token)).map(|r| r.failures)
        {
            let retry_at = now.add_ms(self.backoff_ms(failures));
            let Some(r) = self.rejecting.as_mut() else { return };
            r.token = None;
            let reason = r.reason;
            match decision {
                Permission::Unknown => {
                    // etcd could not be asked: nothing is answered before it decides (it may
                    // refuse for permission); asked again after a backoff.
                    r.retry_at = Some(retry_at);
                    r.failures += 1;
                    return;
                }
                Permission::Denied(denied) => self.reject_create(-1, &denied),
                Permission::Allowed => self.reject_create(-1, reason),
            }
            self.rejecting = None;
            return self.take_requests();
        }
        let Some(id) = self.by_permission.remove(&token) else { return };
        let Some(w) = self.watches.get(&id) else { return };
        if w.source != (Source::Authorizing { token }) {
            return;
        }
        let cache = w.cache;
        match (decision, cache) {
            (Permission::Allowed, Some(c)) => {
                let start = w.spec.start_revision.max(0) as u64;
                if let Some(w) = self.watches.get_mut(&id) {
                    w.permitted = true;
                }
                self.start_on_cache(id, c, start, self.cfg.create_wait_ms);
            }
            (Permission::Denied(reason), _) => {
                let r = PbWatchResponse { cancel_reason: reason, ..Default::default() };
                self.refuse(id, r);
            }
            (Permission::Allowed | Permission::Unknown, _) => self.open_relay(id),
        }
        self.take_requests();
    }

    /// A cache's status changed (the session uses it to decide where a watch can resume).
    pub fn handle_cache_status(&mut self, cache: usize, status: CacheStatus) {
        if let Some(c) = self.caches.get_mut(cache) {
            self.best_rev = self.best_rev.max(status.rv);
            c.status = status;
        }
    }

    /// Time passed: fires every timer due at `now`. Harmless when called early.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.advance(now);
        // Per-watch timers.
        let due: Vec<(i64, Source)> = self
            .watches
            .iter()
            .filter_map(|(id, w)| match w.source {
                Source::Waiting { until } if until <= now => Some((*id, w.source)),
                Source::RelayOpening { since, .. }
                    if self.may_announce_self(w)
                        && since.add_ms(self.cfg.upstream_create_wait_ms) <= now =>
                {
                    Some((*id, w.source))
                }
                _ => None,
            })
            .collect();
        for (id, source) in due {
            match source {
                Source::Waiting { .. } => self.resume(id),
                Source::RelayOpening { .. } => self.announce_self(id),
                _ => {}
            }
        }
        if self.rejecting.as_ref().and_then(|r| r.retry_at).is_some_and(|t| t <= now) {
            self.ask_rejecting();
        }
        let retry_relays = self.cfg.progress_retry_ms * 3;
        if let Some(q) = self.query.as_mut().filter(|q| q.started.add_ms(retry_relays) <= now) {
            // A relay did not answer (etcd drops a progress request while a watcher on its
            // stream is still catching up): ask it again (caches always answer).
            q.started = now;
            let relays: Vec<RelayId> = q.relays.iter().copied().collect();
            for relay in relays {
                self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Progress { relay }));
            }
        }
        if self.progress_retry_at.is_some_and(|t| t <= now) {
            self.progress_retry_at = None;
            if self.progress_wanted && self.query.is_none() {
                self.start_query();
            }
        }
        if self.next_tick <= now {
            self.next_tick = now.add_ms(self.cfg.progress_notify_interval_ms.max(1));
            self.progress_tick();
        }
        if self.next_rejoin <= now {
            self.next_rejoin = now.add_ms(self.cfg.rejoin_interval_ms.max(1));
            self.rejoin_tick();
        }
        self.take_requests();
    }

    /// The stream ends: every source is stopped.
    pub fn close(&mut self) {
        let ids: Vec<i64> = self.watches.keys().copied().collect();
        for id in ids {
            self.remove_watch(id);
        }
        self.announce.clear();
        self.ended.clear();
        self.requests.clear();
        self.query = None;
        self.progress_wanted = false;
    }

    // ----- polls ------------------------------------------------------------------------------

    /// The next output.
    pub fn poll_output(&mut self) -> Option<SessionOutput> {
        let o = self.outputs.pop_front();
        if o.is_none() {
            release(&mut self.outputs);
        }
        o
    }

    /// The next deadline and why.
    pub fn poll_timeout(&self) -> Option<(Timestamp, TimerReason)> {
        let mut best: Option<(Timestamp, TimerReason)> = None;
        let mut consider = |t: Timestamp, r: TimerReason| {
            if best.is_none_or(|(b, _)| t < b) {
                best = Some((t, r));
            }
        };
        if self.watches.values().any(|w| w.spec.progress_notify) {
            consider(self.next_tick, TimerReason::ProgressTick);
        }
        if let Some(t) = self.progress_retry_at {
            consider(t, TimerReason::ProgressRetry);
        }
        if let Some(t) = self.rejecting.as_ref().and_then(|r| r.retry_at) {
            consider(t, TimerReason::Permission);
        }
        if let Some(q) = &self.query {
            consider(q.started.add_ms(self.cfg.progress_retry_ms * 3), TimerReason::ProgressRetry);
        }
        let mut rejoin = false;
        for w in self.watches.values() {
            match w.source {
                Source::Waiting { until } => consider(until, TimerReason::Resume),
                Source::RelayOpening { since, .. } if self.may_announce_self(w) => consider(
                    since.add_ms(self.cfg.upstream_create_wait_ms),
                    TimerReason::AnnounceCreate,
                ),
                Source::Relay { .. } if w.cache.is_some() => rejoin = true,
                _ => {}
            }
        }
        if rejoin {
            consider(self.next_rejoin, TimerReason::Rejoin);
        }
        best
    }

    // ----- getters ----------------------------------------------------------------------------

    /// Open watches (announced or not).
    pub fn watch_count(&self) -> usize {
        self.watches.len()
    }

    /// Watches served by a relay right now.
    pub fn relayed_count(&self) -> usize {
        self.watches.values().filter(|w| matches!(w.source, Source::Relay { .. })).count()
    }

    /// The ids of the open watches.
    pub fn watch_ids(&self) -> Vec<i64> {
        self.watches.keys().copied().collect()
    }

    // ----- creation ---------------------------------------------------------------------------

    fn create(&mut self, spec: CreateSpec, requested_id: i64) {
        // Watch id: the client's, or the next one (etcd's AutoWatchID = 0); never reused.
        let auto_from = (requested_id == 0).then_some(self.next_auto_id);
        let id = if requested_id != 0 {
            if self.id_in_use(requested_id) {
                let (key, range_end) = etcd_range(&spec.range);
                return self.reject_create_checked(key, range_end, ERR_DUPLICATE_ID);
            }
            requested_id
        } else {
            let id = self.free_auto_id();
            self.next_auto_id = id + 1;
            id
        };
        let cache = self.cache_for(&spec.range);
        let start = spec.start_revision as u64;
        let w = Watch {
            cache,
            source: Source::Idle,
            delivered: start.saturating_sub(1),
            vouched: 0,
            min_rev: start,
            start_rev: start,
            from_now: start == 0,
            announced: false,
            created: None,
            doomed: false,
            auto_from,
            permitted: false,
            held: Vec::new(),
            fragments: None,
            events_since_tick: false,
            periodic_due: false,
            failures: 0,
            spec,
        };
        self.watches.insert(id, w);
        self.undecided = Some(id);
        self.epoch += 1;
        self.announce.push_back(Announce::Watch(id));
        self.invalidate_query(id);
        match cache {
            Some(_) if self.cfg.check_permissions => self.authorize(id),
            Some(c) => self.start_on_cache(id, c, start, self.cfg.create_wait_ms),
            None => self.open_relay(id),
        }
        self.flush_announcements();
    }

    /// Asks etcd whether the client may read a cached watch's range (`isWatchPermitted`).
    fn authorize(&mut self, id: i64) {
        let token = self.next_token();
        let Some(w) = self.watches.get_mut(&id) else { return };
        w.source = Source::Authorizing { token };
        let (key, range_end) = etcd_range(&w.spec.range);
        self.by_permission.insert(token, id);
        self.outputs.push_back(SessionOutput::CheckPermission { token, key, range_end });
    }

    /// A create etcd's watch store refuses (an empty range, a duplicate id). With permissions
    /// checked, etcd asks the permission first (`isWatchPermitted` before `watchStream.Watch`):
    /// a client that may not read the range hears that refusal instead. Requests wait for it.
    fn reject_create_checked(&mut self, key: Vec<u8>, range_end: Vec<u8>, reason: &'static str) {
        if !self.cfg.check_permissions {
            return self.reject_create(-1, reason);
        }
        let rejecting =
            Rejecting { token: None, reason, key, range_end, retry_at: None, failures: 0 };
        self.rejecting = Some(rejecting);
        self.ask_rejecting();
    }

    /// Asks etcd the permission for the create being refused.
    fn ask_rejecting(&mut self) {
        let token = self.next_token();
        let Some(r) = self.rejecting.as_mut() else { return };
        (r.token, r.retry_at) = (Some(token), None);
        let (key, range_end) = (r.key.clone(), r.range_end.clone());
        self.outputs.push_back(SessionOutput::CheckPermission { token, key, range_end });
    }

    /// etcd refused the stream's token as unknown after it took it on this stream, or after
    /// an outage this stream outlived: etcd forgot it (a restart forgets simple tokens; an
    /// unused one expires, and a client whose reads the cache answers uses it less). etcd's
    /// own clients do not meet this on an open stream: the restart breaks it, and clientv3
    /// authenticates for every new stream. So the stream ends as a broken one does (true), and
    /// the client comes back with a fresh token and resumes its watches. Otherwise the refusal
    /// is etcd's own answer (false).
    fn token_forgotten(&mut self, reason: &str) -> bool {
        let maybe_known = self.token_taken || self.outlived_outage;
        if !maybe_known || !reason.contains(ERR_INVALID_AUTH_TOKEN) {
            return false;
        }
        if !self.ending {
            self.ending = true;
            self.outputs.push_back(SessionOutput::End(END_FORGOTTEN_TOKEN.to_owned()));
        }
        true
    }

    fn reject_create(&mut self, watch_id: i64, reason: &str) {
        let r = PbWatchResponse {
            header: Some(header_at(self.best_rev)),
            watch_id,
            created: true,
            canceled: true,
            cancel_reason: reason.to_owned(),
            ..Default::default()
        };
        self.announce.push_back(Announce::Ready(r));
        self.flush_announcements();
    }

    /// A create refused once taken (permission, etcd's refusal): answered in its turn as etcd
    /// answers a refused create, with id -1; the id it was given is free again (requests wait
    /// while a refusal is possible, so no later create has taken the next one).
    fn refuse(&mut self, id: i64, mut r: PbWatchResponse) {
        r.watch_id = -1;
        r.created = true;
        r.canceled = true;
        if r.header.is_none() {
            r.header = Some(header_at(self.best_rev));
        }
        self.stop_source(id);
        let Some(w) = self.watches.remove(&id) else { return };
        self.invalidate_query(id);
        // As if it had never been taken: etcd's `nextID` does not move for a refused create.
        if let Some(from) = w.auto_from.filter(|_| self.next_auto_id == id + 1) {
            self.next_auto_id = from;
        }
        match self.announce.iter_mut().find(|a| matches!(a, Announce::Watch(x) if *x == id)) {
            Some(a) => *a = Announce::Ready(r),
            None => self.announce.push_back(Announce::Ready(r)),
        }
    }

    /// Sends, in order, every `created` (and what waits behind it) whose turn has come.
    fn flush_announcements(&mut self) {
        self.flush_announcements_inner();
        if self.announce.is_empty() {
            release(&mut self.announce);
        }
    }

    fn flush_announcements_inner(&mut self) {
        while let Some(front) = self.announce.front() {
            match front {
                Announce::Ready(_) => {
                    if let Some(Announce::Ready(r)) = self.announce.pop_front() {
                        self.outputs.push_back(SessionOutput::Respond(Response::Message(r)));
                    }
                }
                Announce::Watch(id) => {
                    let id = *id;
                    let Some(w) = self.watches.get_mut(&id) else {
                        self.announce.pop_front();
                        continue;
                    };
                    let Some(created) = w.created.take() else { return };
                    self.announce.pop_front();
                    w.announced = true;
                    let held = std::mem::take(&mut w.held);
                    let doomed = w.doomed;
                    self.outputs.push_back(SessionOutput::Respond(Response::Message(*created)));
                    for r in held {
                        self.outputs.push_back(SessionOutput::Respond(r));
                    }
                    if doomed {
                        // etcd ended it (the cancel went out with `held`): its id stays taken.
                        self.remove_watch(id);
                        self.ended.insert(id);
                    }
                }
                Announce::Cancel(id) => {
                    let id = *id;
                    self.announce.pop_front();
                    if let Some(r) = self.cancel_answer(id) {
                        self.respond_now(r);
                    }
                }
            }
        }
    }

    fn created_response(&self, id: i64, rev: u64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(header_at(rev)),
            watch_id: id,
            created: true,
            ..Default::default()
        }
    }

    /// etcd could not be asked in time: the session answers `created` itself and keeps trying.
    fn announce_self(&mut self, id: i64) {
        let best = self.best_rev;
        let Some(w) = self.watches.get_mut(&id) else { return };
        if w.announced || w.created.is_some() {
            return;
        }
        let mut reopen = false;
        // (Knowing no revision at all, "now" stays for the relay to learn: a watch from
        // revision 1 would replay the whole history.)
        if w.from_now && best > 0 {
            // "Now" is the newest revision the session knows of: every event after it follows
            // (a relay still waiting to open "from now" would start later: it opens again
            // from here).
            w.from_now = false;
            w.delivered = best;
            w.min_rev = best + 1;
            reopen = matches!(w.source, Source::RelayOpening { .. });
        }
        // Now, also for a watch whose start is still to come (its `delivered` is that start − 1).
        let created = self.created_response(id, best);
        if let Some(w) = self.watches.get_mut(&id) {
            w.created = Some(Box::new(created));
        }
        if reopen {
            self.stop_source(id);
            self.open_relay(id);
        }
    }

    // ----- cancel -----------------------------------------------------------------------------

    fn client_cancel(&mut self, id: i64) {
        if self.watches.get(&id).is_some_and(|w| !w.announced) {
            // Answered in its turn: after the watch's `created`, before what came after it
            // (etcd answers both on one channel, in request order).
            return self.announce.push_back(Announce::Cancel(id));
        }
        if let Some(r) = self.cancel_answer(id) {
            self.respond_in_turn(r);
        }
    }

    /// Ends an announced watch for the client's cancel: etcd's answer, or `None` where etcd
    /// says nothing (no watch holds the id).
    fn cancel_answer(&mut self, id: i64) -> Option<PbWatchResponse> {
        if self.ended.remove(&id) {
            // etcd's `watchStream.Cancel` finds the compacted watcher and answers.
            return Some(canceled_response(id, self.best_rev));
        }
        let w = self.watches.get(&id).filter(|w| w.announced)?;
        let rev = self.best_rev.max(w.vouched);
        self.remove_watch(id);
        Some(canceled_response(id, rev))
    }

    /// Ends a watch because its source ended it for good (etcd's compaction cancel): the client
    /// hears it as etcd said it, and the id stays taken until the client cancels it.
    fn server_cancel(&mut self, id: i64, mut r: PbWatchResponse) {
        r.watch_id = id;
        r.created = false;
        let Some(w) = self.watches.get_mut(&id) else { return };
        if w.announced {
            self.remove_watch(id);
            self.ended.insert(id);
            self.respond_now(r);
        } else {
            // Not announced yet: `created` first (etcd sends both), then the cancel.
            if w.created.is_none() {
                let rev = r.header.as_ref().map_or(self.best_rev, |h| h.revision.max(0) as u64);
                w.created = Some(Box::new(PbWatchResponse {
                    header: Some(header_at(rev)),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                }));
            }
            w.held.push(Response::Message(r));
            w.doomed = true;
            self.stop_source(id);
        }
    }

    fn remove_watch(&mut self, id: i64) {
        self.stop_source(id);
        if self.watches.remove(&id).is_some() {
            self.invalidate_query(id);
        }
    }

    /// Stops the watch's source (the watch stays, between sources).
    fn stop_source(&mut self, id: i64) {
        let Some(w) = self.watches.get_mut(&id) else { return };
        let old = std::mem::replace(&mut w.source, Source::Idle);
        w.fragments = None;
        match old {
            Source::Cache { cache, tag, core } => {
                self.by_tag.remove(&tag);
                self.outputs.push_back(SessionOutput::Cache {
                    cache,
                    cmd: CacheCmd::Cancel { watch: core },
                });
            }
            Source::CacheStarting { tag, .. } => {
                // Its Started, if it comes, is recognised as stale and cancelled.
                let _ = tag;
            }
            Source::RelayOpening { relay, .. } | Source::Relay { relay } => {
                self.by_relay.remove(&relay);
                self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Close { relay }));
                // A query waiting on this relay's answer would wait for ever: it is closed.
                if let Some(q) = self.query.as_mut() {
                    q.relays.remove(&relay);
                }
            }
            Source::Authorizing { token } => {
                self.by_permission.remove(&token);
            }
            Source::Waiting { .. } | Source::Idle => {}
        }
        self.invalidate_query(id);
        // The query may have nothing left to wait for: it is asked again shortly.
        self.try_finish_query();
    }

    // ----- sources ----------------------------------------------------------------------------

    fn start_on_cache(&mut self, id: i64, cache: usize, start_rev: u64, wait_ready_ms: u64) {
        let tag = WatchTag(self.next_tag);
        self.next_tag += 1;
        let Some(w) = self.watches.get_mut(&id) else { return };
        w.source = Source::CacheStarting { cache, tag };
        let range = w.spec.range.clone();
        self.by_tag.insert(tag, id);
        self.tag_cache.insert(tag, cache);
        self.invalidate_query(id);
        self.outputs.push_back(SessionOutput::Cache {
            cache,
            cmd: CacheCmd::Start { tag, range, start_rev, wait_ready_ms },
        });
    }

    fn open_relay(&mut self, id: i64) {
        let relay = RelayId(self.next_relay);
        self.next_relay += 1;
        let now = self.now;
        let Some(w) = self.watches.get_mut(&id) else { return };
        // From "now" while etcd decides what now is; otherwise right after the last revision
        // delivered.
        let from = if w.from_now && !w.announced { 0 } else { w.delivered + 1 };
        w.source = Source::RelayOpening { relay, since: now };
        let mut create = etcd_client::proto::PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
        };
        if let Some(PbWatchRequestUnion::CreateRequest(c)) = create.request_union.as_mut() {
            (c.key, c.range_end) = etcd_range(&w.spec.range);
            c.start_revision = from as i64;
            c.prev_kv = w.spec.prev_kv;
            c.progress_notify = w.spec.progress_notify;
            c.fragment = w.spec.fragment;
            c.filters = w.spec.filters();
        }
        let permitted = w.permitted;
        self.by_relay.insert(relay, id);
        self.invalidate_query(id);
        self.outputs.push_back(SessionOutput::Note(Note::ServedFromEtcd));
        self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Open {
            relay,
            request: create,
            permitted,
        }));
    }

    /// Puts a watch that is between sources back on one: its cache if the window holds the
    /// next revision (or the cache is relisting: it waits a little), else a relay.
    fn resume(&mut self, id: i64) {
        let Some(w) = self.watches.get(&id) else { return };
        let next = w.delivered + 1;
        if self.awaits_permission(w) {
            // etcd has not let the client read the range yet: ask again (a cached watch) or
            // let etcd decide through a relay; never the cache before that.
            return match w.cache {
                Some(_) => self.authorize(id),
                None => self.open_relay(id),
            };
        }
        if let Some(c) = w.cache {
            let status = &self.caches[c].status;
            if status.can_serve_from(next) {
                return self.start_on_cache(id, c, next, 0);
            }
            if !status.ready && w.from_now && !w.announced {
                return self.start_on_cache(id, c, 0, self.cfg.create_wait_ms);
            }
        }
        self.open_relay(id);
    }

    /// The wait before the next try after `failures` failed ones (doubling, capped).
    fn backoff_ms(&self, failures: u32) -> u64 {
        (self.cfg.backoff_min_ms << failures.min(10)).min(self.cfg.backoff_max_ms)
    }

    fn backoff(&mut self, id: i64) {
        let now = self.now;
        let Some(failures) = self.watches.get(&id).map(|w| w.failures) else { return };
        let delay = self.backoff_ms(failures);
        let Some(w) = self.watches.get_mut(&id) else { return };
        w.failures += 1;
        w.source = Source::Waiting { until: now.add_ms(delay) };
        self.invalidate_query(id);
    }

    fn on_cache_started(&mut self, tag: WatchTag, core: RequestId, after_rev: u64) {
        let Some(cache) = self.tag_cache.remove(&tag) else { return };
        let id = self.by_tag.get(&tag).copied();
        let current = id
            .and_then(|id| self.watches.get(&id).map(|w| (id, w)))
            .filter(|(_, w)| w.source == Source::CacheStarting { cache, tag });
        let Some((id, _)) = current else {
            // An attempt the session gave up on: nothing must come of it.
            self.by_tag.remove(&tag);
            self.outputs
                .push_back(SessionOutput::Cache { cache, cmd: CacheCmd::Cancel { watch: core } });
            return;
        };
        let Some(w) = self.watches.get_mut(&id) else { return };
        // A watch from "now" is told where now is: its events are those after the header
        // (the core may have registered it after the cache moved on, replaying what it missed).
        // Any other is created at the newest revision known, as etcd's `created` carries its
        // revision now, also for a start in the future (never that start − 1).
        let header = header_at(if w.from_now { after_rev } else { self.best_rev });
        w.source = Source::Cache { cache, tag, core };
        w.failures = 0;
        if w.from_now {
            w.from_now = false;
            w.delivered = after_rev;
            w.min_rev = after_rev + 1;
        }
        if !w.announced && w.created.is_none() {
            w.created = Some(Box::new(PbWatchResponse {
                header: Some(header),
                watch_id: id,
                created: true,
                ..Default::default()
            }));
        }
        self.outputs.push_back(SessionOutput::Note(Note::ServedFromCache));
    }

    fn on_cache_refused(&mut self, tag: WatchTag, reason: &str) {
        self.tag_cache.remove(&tag);
        let Some(id) = self.by_tag.remove(&tag) else { return };
        let Some(w) = self.watches.get(&id) else { return };
        if !matches!(w.source, Source::CacheStarting { tag: t, .. } if t == tag) {
            return;
        }
        tracing::debug!(watch_id = id, reason, "the cache cannot serve the watch; going to etcd");
        self.open_relay(id);
    }

    fn on_cache_events(&mut self, run: &Arc<EventRun>, tag: WatchTag, picks: &Picks) {
        let Some(&id) = self.by_tag.get(&tag) else { return };
        let max_bytes = self.cfg.max_response_bytes;
        let Some(w) = self.watches.get_mut(&id) else { return };
        let Source::Cache { cache, tag: t, core } = w.source else { return };
        if t != tag {
            return;
        }
        // Never below the start, never again what was delivered (a new source resumes after
        // it), never what the filters leave out.
        let (min_rev, delivered, no_put, no_delete) =
            (w.min_rev, w.delivered, w.spec.no_put, w.spec.no_delete);
        let sent = |ev: &cacher_core::Event| {
            let rev = ev.rv();
            rev >= min_rev && rev > delivered && !(if ev.is_delete() { no_delete } else { no_put })
        };
        let events = || picks.iter().filter_map(|i| run.event(i).map(|ev| (i, &**ev)));
        w.delivered = events().map(|(_, ev)| ev.rv()).fold(delivered, u64::max);
        let credit = Credit { cache, watch: core, n: picks.len() as u64 };
        // Each response but the last goes out as it is made; the last carries the credit
        // back, when the transport takes it.
        let mut last: Option<Response> = None;
        let mut sent_rev = 0;
        let prev_kv = w.spec.prev_kv;
        let fragment_bytes = w.spec.fragment.then_some(self.cfg.fragment_bytes);
        let outputs = &mut self.outputs;
        let mut push = |picks: Picks, size: usize, fragment: bool| {
            sent_rev = picks.iter().last().and_then(|i| run.event(i)).map_or(0, |e| e.rv());
            let r = Response::Events(EventsResponse {
                size,
                watch_id: id,
                header: PbResponseHeader {
                    revision: run.header_rev() as i64,
                    ..Default::default()
                },
                run: run.clone(),
                picks,
                prev_kv,
                fragment,
                credit: None,
            });
            if let Some(prev) = last.replace(r) {
                deliver(outputs, w, prev);
            }
        };
        frames(events().filter(|(_, ev)| sent(ev)), prev_kv, max_bytes, |picks, size| {
            match fragment_bytes {
                // `size` is an estimate: the exact sizes are taken once it is near the limit.
                Some(limit) if size >= limit / 2 => {
                    for (p, size, more) in fragments(run, picks, prev_kv, limit) {
                        push(p, size, more);
                    }
                }
                _ => push(picks, size, false),
            }
        });
        match last {
            Some(Response::Events(mut e)) => {
                w.events_since_tick = true;
                w.periodic_due = false;
                w.vouched = w.vouched.max(sent_rev);
                e.credit = Some(credit);
                deliver(&mut self.outputs, w, Response::Events(e));
            }
            // Nothing to send: the credit at once.
            _ => self.outputs.push_back(SessionOutput::Cache {
                cache,
                cmd: CacheCmd::Credit { watch: core, n: credit.n },
            }),
        }
    }

    fn on_cache_closed(&mut self, tag: WatchTag, cause: CloseCause) {
        let Some(id) = self.by_tag.remove(&tag) else { return };
        let Some(w) = self.watches.get_mut(&id) else { return };
        if !matches!(w.source, Source::Cache { tag: t, .. } if t == tag) {
            return;
        }
        tracing::debug!(
            watch_id = id,
            cause = cause.as_str(),
            delivered = w.delivered,
            "cached watch ended; resuming elsewhere"
        );
        w.source = Source::Waiting { until: self.now };
        self.invalidate_query(id);
        // The cache relists (its window restarts at its new list) or the watch fell out of the
        // window: either way it resumes after the last revision delivered.
        let wait = if cause == CloseCause::Reinitializing { self.cfg.create_wait_ms } else { 0 };
        match (self.watches.get(&id).and_then(|w| w.cache), cause) {
            (Some(c), CloseCause::Reinitializing) => {
                let next = self.watches.get(&id).map_or(0, |w| w.delivered + 1);
                // The new list may already cover it; if not, the cache refuses and a relay
                // takes over.
                self.start_on_cache(id, c, next, wait);
            }
            _ => self.resume(id),
        }
    }

    fn on_relay_response(&mut self, id: i64, relay: RelayId, r: PbWatchResponse) {
        let Some(w) = self.watches.get_mut(&id) else { return };
        let opening = matches!(w.source, Source::RelayOpening { .. });
        if opening {
            if r.canceled && r.compact_revision == 0 && self.token_forgotten(&r.cancel_reason) {
                return;
            }
            let Some(w) = self.watches.get_mut(&id) else { return };
            if r.canceled {
                if r.compact_revision > 0 {
                    self.outputs
                        .push_back(SessionOutput::Note(Note::Compacted(r.compact_revision as u64)));
                }
                if !w.announced && w.created.is_none() {
                    // Refused at once (permission, ...): etcd's own answer.
                    self.refuse(id, r);
                } else {
                    self.server_cancel(id, r);
                }
                return;
            }
            w.source = Source::Relay { relay };
            w.failures = 0;
            w.permitted = true;
            self.token_taken = true;
            if w.from_now {
                let rev = r.header.as_ref().map_or(0, |h| h.revision.max(0) as u64);
                w.from_now = false;
                w.delivered = rev;
                w.min_rev = rev + 1;
            }
            if !w.announced && w.created.is_none() {
                let mut c = r.clone();
                c.watch_id = id;
                c.created = true;
                w.created = Some(Box::new(c));
            }
            self.invalidate_query(id);
            if r.created {
                return;
            }
        }
        let Some(w) = self.watches.get_mut(&id) else { return };
        if r.canceled {
            if r.compact_revision > 0 {
                self.outputs
                    .push_back(SessionOutput::Note(Note::Compacted(r.compact_revision as u64)));
            }
            return self.server_cancel(id, r);
        }
        if r.created {
            return;
        }
        let rev = r.header.as_ref().map_or(0, |h| h.revision.max(0) as u64);
        if r.watch_id == -1 {
            // The answer to the session's progress request on this relay: everything up to
            // `rev` has been relayed.
            w.delivered = w.delivered.max(rev);
            if let Some(q) = self.query.as_mut() {
                if q.relays.remove(&relay) {
                    q.frontiers.insert(id, rev);
                }
            }
            let periodic = w.periodic_due && !w.events_since_tick;
            if periodic {
                w.periodic_due = false;
                self.periodic_progress(id, rev);
            }
            self.try_finish_query();
            self.try_rejoin(id);
            return;
        }
        if r.events.is_empty() {
            // etcd's periodic progress notification for this watch.
            if rev >= w.vouched && rev >= w.start_rev {
                w.delivered = w.delivered.max(rev);
                w.vouched = rev;
                w.events_since_tick = true;
                let mut out = r;
                out.watch_id = id;
                self.respond_for(id, Response::Message(out));
            }
            return;
        }
        // A fragment is held until the last of its response has come: etcd sends a response's
        // fragments one after the other, and clientv3 merges them into one, dropping whatever
        // else comes between (`watchGrpcStream.run`). They go out together; if the source
        // changes before the last has come, the next one sends the response whole.
        if r.fragment {
            match &mut w.fragments {
                Some((from, pieces)) if *from == relay => pieces.push(r),
                _ => w.fragments = Some((relay, vec![r])),
            }
            return;
        }
        let mut pieces = match w.fragments.take() {
            Some((from, pieces)) if from == relay => pieces,
            _ => Vec::new(),
        };
        pieces.push(r);
        // Events: never again what was delivered before (a new relay resumes after it).
        let delivered = w.delivered;
        let rev_of = |e: &etcd_client::proto::PbEvent| {
            e.kv.as_ref().map_or(0, |kv| kv.mod_revision.max(0) as u64)
        };
        for p in pieces.iter_mut() {
            p.events.retain(|e| rev_of(e) > delivered);
        }
        pieces.retain(|p| !p.events.is_empty());
        let Some(last) = pieces.iter().flat_map(|p| p.events.iter().map(rev_of)).max() else {
            return;
        };
        w.delivered = w.delivered.max(last);
        w.vouched = w.vouched.max(last);
        w.events_since_tick = true;
        w.periodic_due = false;
        let n = pieces.len();
        for (i, mut out) in pieces.into_iter().enumerate() {
            out.watch_id = id;
            out.fragment = i + 1 < n;
            self.respond_for(id, Response::Message(out));
        }
    }

    /// What any end of a relay clears: its id, the fragments it held, its place in the
    /// progress query (which is asked again without it).
    fn forget_relay(&mut self, id: i64, relay: RelayId) {
        self.by_relay.remove(&relay);
        if let Some(w) = self.watches.get_mut(&id) {
            w.fragments = None;
        }
        if let Some(q) = self.query.as_mut() {
            if q.relays.remove(&relay) {
                q.blocked = true;
            }
        }
    }

    fn on_relay_ended(
        &mut self,
        id: i64,
        relay: RelayId,
        error: Option<String>,
        unavailable: bool,
    ) {
        self.forget_relay(id, relay);
        let Some(w) = self.watches.get_mut(&id) else { return };
        tracing::debug!(watch_id = id, ?error, unavailable, "relay ended");
        // That relay (the watch's source: `handle_relay` takes only the current one's) is gone:
        // the retry below opens the next; announcing the watch must not open one of its own,
        // which the retry's wait would then forget.
        w.source = Source::Idle;
        let Some(w) = self.watches.get(&id) else { return };
        if !w.announced && w.created.is_none() && !unavailable {
            // etcd refused the create: its reason, as etcd's watch server would answer.
            let reason = error.unwrap_or_else(|| "etcd refused the watch".to_owned());
            let r = PbWatchResponse { cancel_reason: reason, ..Default::default() };
            return self.refuse(id, r);
        }
        if self.may_announce_self(w) {
            // etcd is unreachable: clients of etcd would wait; the watch is announced and its
            // relay tried again until etcd is back. One whose permission etcd has yet to give
            // waits unannounced: etcd may refuse it.
            self.announce_self(id);
        }
        self.backoff(id);
        self.try_finish_query();
    }

    /// A relay that stopped for the session's sake is no failure of etcd's: the watch is taken
    /// up at once after its last revision delivered (on its cache if the window holds it),
    /// with no backoff.
    fn on_relay_paused(&mut self, id: i64, relay: RelayId) {
        self.forget_relay(id, relay);
        tracing::debug!(watch_id = id, "relay paused");
        self.resume(id);
        self.try_finish_query();
    }

    /// Moves a relayed watch back onto its cache if the cache's window holds its next revision.
    fn try_rejoin(&mut self, id: i64) {
        let Some(w) = self.watches.get(&id) else { return };
        let (Some(c), Source::Relay { .. }) = (w.cache, w.source) else { return };
        let next = w.delivered + 1;
        if !self.caches[c].status.can_serve_from(next) {
            return;
        }
        self.stop_source(id);
        self.outputs.push_back(SessionOutput::Note(Note::Rejoined));
        self.start_on_cache(id, c, next, 0);
    }

    fn rejoin_tick(&mut self) {
        let relayed: Vec<(i64, RelayId)> = self
            .watches
            .iter()
            .filter_map(|(id, w)| match (w.cache, w.source) {
                (Some(_), Source::Relay { relay }) => Some((*id, relay)),
                _ => None,
            })
            .collect();
        for (id, relay) in relayed {
            self.try_rejoin(id);
            let still = self.watches.get(&id).is_some_and(|w| w.source == Source::Relay { relay });
            if still {
                // etcd's answer says how far the relay has got; the watch may then rejoin.
                self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Progress { relay }));
            }
        }
    }

    // ----- progress ---------------------------------------------------------------------------

    fn start_query(&mut self) {
        // Every request so far is covered by this query's (fresh) frontiers.
        self.progress_again = false;
        let mut per_cache: BTreeMap<usize, Vec<(WatchTag, RequestId)>> = BTreeMap::new();
        let mut relays = BTreeSet::new();
        let mut blocked = false;
        for w in self.watches.values() {
            match w.source {
                Source::Cache { cache, tag, core } => {
                    per_cache.entry(cache).or_default().push((tag, core))
                }
                Source::Relay { relay } => {
                    relays.insert(relay);
                }
                _ => blocked = true,
            }
        }
        for &relay in &relays {
            self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Progress { relay }));
        }
        // No cached watch: a cache is asked all the same, for the floor (etcd's revision now).
        if per_cache.is_empty() && !relays.is_empty() && !self.caches.is_empty() {
            per_cache.insert(0, Vec::new());
        }
        let mut caches = BTreeMap::new();
        for (cache, watches) in per_cache {
            let token = self.next_token();
            caches.insert(token, cache);
            self.outputs.push_back(SessionOutput::Cache {
                cache,
                cmd: CacheCmd::Frontier { token, watches, fresh: true },
            });
        }
        self.query = Some(Query {
            started: self.now,
            caches,
            relays,
            frontiers: BTreeMap::new(),
            blocked,
            epoch: self.epoch,
            floor: 0,
            reasked: 0,
        });
        self.try_finish_query();
    }

    /// A watch changed source or went away: a query in flight cannot vouch for it.
    fn invalidate_query(&mut self, id: i64) {
        if let Some(q) = self.query.as_mut() {
            q.frontiers.remove(&id);
            q.blocked = true;
        }
    }

    fn on_frontier(&mut self, token: u64, cache_rv: u64, caught_up: Vec<(WatchTag, bool)>) {
        if self.periodic_tokens.remove(&token) {
            for (tag, ok) in caught_up {
                let Some(&id) = self.by_tag.get(&tag) else { continue };
                let Some(w) = self.watches.get_mut(&id) else { continue };
                if !ok || !matches!(w.source, Source::Cache { tag: t, .. } if t == tag) {
                    continue;
                }
                w.delivered = w.delivered.max(cache_rv);
                if w.periodic_due && !w.events_since_tick {
                    w.periodic_due = false;
                    self.periodic_progress(id, cache_rv);
                }
            }
            return;
        }
        let Some(q) = self.query.as_mut() else { return };
        if q.caches.remove(&token).is_none() {
            return;
        }
        q.floor = q.floor.max(cache_rv);
        for (tag, ok) in caught_up {
            let id = self.by_tag.get(&tag).copied();
            let current = id.filter(|id| {
                self.watches
                    .get(id)
                    .is_some_and(|w| matches!(w.source, Source::Cache { tag: t, .. } if t == tag))
            });
            match (current, ok) {
                (Some(id), true) => {
                    q.frontiers.insert(id, cache_rv);
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.delivered = w.delivered.max(cache_rv);
                    }
                }
                _ => q.blocked = true,
            }
        }
        self.try_finish_query();
    }

    /// Answers the client's progress request once every source has answered, if every watch
    /// has been given everything up to one revision that is not below anything the stream has
    /// vouched for; otherwise asks again shortly.
    fn try_finish_query(&mut self) {
        let Some(q) = &self.query else { return };
        if !q.caches.is_empty() || !q.relays.is_empty() {
            return;
        }
        // etcd answers progress requests with no id: a relay's answer below the floor is one
        // etcd computed before this question (an earlier request's, still on its way). It is
        // asked again, a few times at most.
        let stale: Vec<(i64, RelayId)> = self
            .watches
            .iter()
            .filter_map(|(id, w)| match w.source {
                Source::Relay { relay } if q.frontiers.get(id).is_some_and(|f| *f < q.floor) => {
                    Some((*id, relay))
                }
                _ => None,
            })
            .collect();
        if !stale.is_empty() && q.reasked < STALE_REASKS {
            let Some(q) = self.query.as_mut() else { return };
            q.reasked += 1;
            for (id, relay) in stale {
                q.frontiers.remove(&id);
                q.relays.insert(relay);
                self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Progress { relay }));
            }
            return;
        }
        let Some(q) = self.query.take() else { return };
        if !self.progress_wanted {
            return;
        }
        if self.holds_compacted() {
            // A watch ended as compacted while the question was out: etcd drops the request.
            self.progress_wanted = false;
            self.progress_again = false;
            return;
        }
        let complete = !q.blocked
            && q.epoch == self.epoch
            && self.watches.keys().all(|id| q.frontiers.contains_key(id));
        let vouched =
            self.watches.values().map(|w| w.vouched).max().unwrap_or(0).max(self.stream_progress);
        // etcd answers only once it has reached every watch's start revision (a watch on a
        // future revision holds the answer back).
        let start = self.watches.values().map(|w| w.start_rev).max().unwrap_or(0);
        let floor = vouched.max(start);
        let rev = if self.watches.is_empty() {
            Some(self.best_rev.max(floor))
        } else if complete {
            q.frontiers.values().copied().min().filter(|r| *r >= floor)
        } else {
            None
        };
        let Some(rev) = rev else {
            // Not yet: a cache behind the others is asked to catch up with etcd, and the
            // question is asked again soon (etcd itself answers once its watchers are synced).
            let lowest = q.frontiers.values().copied().min().unwrap_or(0);
            let mut retry = self.cfg.progress_retry_ms;
            if complete && lowest < vouched {
                let lagging: BTreeSet<usize> = self
                    .watches
                    .iter()
                    .filter_map(|(id, w)| match w.source {
                        Source::Cache { cache, .. }
                            if q.frontiers.get(id).is_some_and(|f| *f < vouched) =>
                        {
                            Some(cache)
                        }
                        _ => None,
                    })
                    .collect();
                for cache in lagging {
                    self.outputs
                        .push_back(SessionOutput::Cache { cache, cmd: CacheCmd::RequestProgress });
                }
            } else if complete {
                // Waiting for etcd to reach a watch's future start revision: nothing to hurry.
                retry *= 5;
            }
            self.progress_retry_at = Some(self.now.add_ms(retry));
            return;
        };
        self.progress_wanted = false;
        self.stream_progress = rev;
        for w in self.watches.values_mut() {
            w.vouched = w.vouched.max(rev);
            w.delivered = w.delivered.max(rev);
        }
        let r =
            PbWatchResponse { header: Some(header_at(rev)), watch_id: -1, ..Default::default() };
        // After every `created` already asked for, as etcd answers requests in order.
        self.respond_in_turn(r);
        if self.progress_again {
            // A request came after this query began: it gets an answer of its own.
            self.progress_wanted = true;
            self.start_query();
        }
    }

    fn progress_tick(&mut self) {
        let mut per_cache: BTreeMap<usize, Vec<(WatchTag, RequestId)>> = BTreeMap::new();
        let mut relays = Vec::new();
        for w in self.watches.values_mut() {
            if w.spec.progress_notify && w.announced && !w.events_since_tick {
                match w.source {
                    Source::Cache { cache, tag, core } => {
                        w.periodic_due = true;
                        per_cache.entry(cache).or_default().push((tag, core));
                    }
                    Source::Relay { relay } => {
                        w.periodic_due = true;
                        relays.push(relay);
                    }
                    _ => {}
                }
            } else {
                w.periodic_due = false;
            }
            w.events_since_tick = false;
        }
        for (cache, watches) in per_cache {
            let token = self.next_token();
            self.periodic_tokens.insert(token);
            self.outputs.push_back(SessionOutput::Cache {
                cache,
                cmd: CacheCmd::Frontier { token, watches, fresh: false },
            });
        }
        for relay in relays {
            self.outputs.push_back(SessionOutput::Upstream(UpstreamCmd::Progress { relay }));
        }
    }

    /// A periodic progress notification for one watch at `rev`, if it keeps the watch's
    /// revisions going up and is not below its start (etcd #20221).
    fn periodic_progress(&mut self, id: i64, rev: u64) {
        let Some(w) = self.watches.get_mut(&id) else { return };
        if rev < w.vouched || rev < w.start_rev || !w.announced {
            return;
        }
        w.vouched = rev;
        let r =
            PbWatchResponse { header: Some(header_at(rev)), watch_id: id, ..Default::default() };
        self.respond_now(r);
    }

    // ----- helpers ----------------------------------------------------------------------------

    fn advance(&mut self, now: Timestamp) {
        if now > self.now {
            self.now = now;
        }
    }

    fn next_token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// The cache whose prefix holds every key of `range` (the longest such prefix).
    fn cache_for(&self, range: &KeyRange) -> Option<usize> {
        self.caches
            .iter()
            .enumerate()
            .filter(|(_, c)| range_within_prefix(range, &c.prefix))
            .max_by_key(|(_, c)| c.prefix.len())
            .map(|(i, _)| i)
    }

    /// A response that keeps its place among the `created` responses still owed (etcd's
    /// `ctrlStream`: the answer to a client's cancel, a requested progress notification).
    fn respond_in_turn(&mut self, r: PbWatchResponse) {
        self.announce.push_back(Announce::Ready(r));
    }

    fn respond_now(&mut self, r: PbWatchResponse) {
        self.outputs.push_back(SessionOutput::Respond(Response::Message(r)));
    }

    /// A response for watch `id`: now, or after its `created`.
    fn respond_for(&mut self, id: i64, r: Response) {
        match self.watches.get_mut(&id) {
            Some(w) if !w.announced => w.held.push(r),
            _ => self.outputs.push_back(SessionOutput::Respond(r)),
        }
    }
}

/// etcd's answer to a client's cancel of watch `id`.
fn canceled_response(id: i64, rev: u64) -> PbWatchResponse {
    PbWatchResponse {
        header: Some(header_at(rev)),
        watch_id: id,
        canceled: true,
        ..Default::default()
    }
}

/// A header at `rev`; the host fills in etcd's cluster and member ids on the way out.
fn header_at(rev: u64) -> PbResponseHeader {
    PbResponseHeader { revision: rev as i64, ..Default::default() }
}

/// Splits a watch's events into responses of about `max_bytes`, only between revisions; each
/// with its size.
fn frames<'a>(
    kept: impl Iterator<Item = (u32, &'a cacher_core::Event)>,
    prev_kv: bool,
    max_bytes: usize,
    mut emit: impl FnMut(Picks, usize),
) {
    let mut current: Option<Picks> = None;
    let mut size = 0usize;
    let mut kept = kept.peekable();
    while let Some((i, ev)) = kept.next() {
        size += event_size(ev, prev_kv);
        match current.as_mut() {
            Some(p) => p.push(i),
            None => current = Some(Picks::one(i)),
        }
        let boundary = kept.peek().is_none_or(|(_, next)| next.rv() != ev.rv());
        if boundary && size >= max_bytes {
            if let Some(p) = current.take() {
                emit(p, size + 40);
            }
            size = 0;
        }
    }
    if let Some(p) = current {
        emit(p, size + 40);
    }
}

/// Bytes of a watch response besides its events (header and watch id), for [`fragments`].
const RESPONSE_OVERHEAD: usize = 32;

/// etcd's `sendFragments` (`v3rpc/watch.go`) for a watch created with `fragment`: a response
/// of `limit` bytes or more with two events or more goes as several, each taking events while
/// it stays below `limit` (the first event always), all but the last marked as a fragment.
/// Each with its size and whether more follow. (A fragment may cut a revision: the client
/// joins them, as etcd's clients do.)
fn fragments(
    run: &EventRun,
    picks: Picks,
    prev_kv: bool,
    limit: usize,
) -> Vec<(Picks, usize, bool)> {
    // The bytes that will be sent: the run's shared encodings, made here once instead of later.
    let size = |i: u32| run.encoding(i, prev_kv, crate::convert::encode_event_field).len();
    let sizes: Vec<(u32, usize)> = picks.iter().map(|i| (i, size(i))).collect();
    let total = RESPONSE_OVERHEAD + sizes.iter().map(|(_, s)| s).sum::<usize>();
    if total < limit || sizes.len() < 2 {
        return vec![(picks, total, false)];
    }
    let mut out = Vec::new();
    let mut rest = sizes.iter().peekable();
    while let Some(&(first, s)) = rest.next() {
        // The `fragment` flag counts: two bytes.
        let mut cur = Picks::one(first);
        let mut bytes = RESPONSE_OVERHEAD + 2 + s;
        while let Some(&&(i, s)) = rest.peek() {
            if bytes + s >= limit {
                break;
            }
            cur.push(i);
            bytes += s;
            rest.next();
        }
        out.push((cur, bytes, rest.peek().is_some()));
    }
    out
}

/// A watch's response: to the client, or held until its `created` has gone out.
fn deliver(outputs: &mut VecDeque<SessionOutput>, w: &mut Watch, r: Response) {
    if w.announced {
        outputs.push_back(SessionOutput::Respond(r));
    } else {
        w.held.push(r);
    }
}

/// Roughly an event's size on the wire.
pub(crate) fn event_size(ev: &cacher_core::Event, prev_kv: bool) -> usize {
    let obj = ev.object().map_or(0, |o| o.value().map_or(0, <[u8]>::len));
    let prev = if prev_kv { ev.prev().map_or(0, |o| o.value().map_or(0, <[u8]>::len)) } else { 0 };
    ev.key().len() * 2 + obj + prev + 40
}

/// Gives an empty queue's buffer back: an idle stream holds none (tens of thousands of streams
/// each kept a few hundred bytes from their last burst).
fn release<T>(q: &mut VecDeque<T>) {
    if q.is_empty() && q.capacity() > 0 {
        *q = VecDeque::new();
    }
}
