//! The watch session driven deterministically: a fake cache (a window over a shared history)
//! and a fake etcd (relays over the same history), messages delivered when the test says, time
//! moved by hand. Each of the reliability issue's findings has its test here.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use cacher_core::{Event, Key, KeyRange, Object, RequestId, Timestamp};
use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};

use super::*;
use crate::cache::delivery::{CacheMsg, EventRun, WatchItems, WatchTag};
use crate::cache::CacheStatus;
use crate::convert::pb_event;

/// etcd's history: every revision's events, in order.
#[derive(Default)]
struct History {
    revisions: Vec<(u64, Vec<Arc<Event>>)>,
    store: BTreeMap<Vec<u8>, Arc<Object>>,
    rev: u64,
}

impl History {
    fn put(&mut self, keys: &[&str]) -> u64 {
        self.rev += 1;
        let rev = self.rev;
        let mut evs = Vec::new();
        for k in keys {
            let o = Arc::new(Object::new(k.as_bytes(), Some(format!("v{rev}").as_bytes()), rev));
            let prev = self.store.insert(k.as_bytes().to_vec(), o.clone());
            evs.push(Arc::new(Event::put(o, prev, Timestamp::ZERO)));
        }
        self.revisions.push((rev, evs));
        rev
    }

    fn events_in(&self, range: &KeyRange, after: u64, upto: u64) -> Vec<Arc<Event>> {
        self.revisions
            .iter()
            .filter(|(r, _)| *r > after && *r <= upto)
            .flat_map(|(_, evs)| evs.iter().filter(|e| range.contains(e.key())).cloned())
            .collect()
    }
}

struct FakeCache {
    ready: bool,
    rv: u64,
    /// The oldest revision a watch can start at.
    oldest: u64,
    compacted: u64,
    watches: BTreeMap<RequestId, (WatchTag, KeyRange)>,
    next: u64,
    inbox: VecDeque<CacheMsg>,
}

impl FakeCache {
    fn new(rv: u64, oldest: u64) -> FakeCache {
        FakeCache {
            ready: true,
            rv,
            oldest,
            compacted: 0,
            watches: BTreeMap::new(),
            next: 1,
            inbox: VecDeque::new(),
        }
    }

    fn status(&self) -> CacheStatus {
        CacheStatus {
            ready: self.ready,
            rv: self.rv,
            oldest_servable: Some(self.oldest),
            compacted: self.compacted,
            ..CacheStatus::default()
        }
    }

    fn command(&mut self, cmd: CacheCmd, h: &History) {
        match cmd {
            CacheCmd::Start { tag, range, start_rev, .. } => {
                if !self.ready || (start_rev != 0 && start_rev < self.oldest) {
                    self.inbox
                        .push_back(CacheMsg::Refused { tag, reason: "outside the window".into() });
                    return;
                }
                let after = if start_rev == 0 { self.rv } else { start_rev - 1 };
                let id = RequestId(self.next);
                self.next += 1;
                self.inbox.push_back(CacheMsg::Started {
                    tag,
                    watch: id,
                    after_rev: after,
                    cache_rv: self.rv,
                });
                let replay = h.events_in(&range, after, self.rv);
                if !replay.is_empty() {
                    let n = replay.len() as u32;
                    let run = Arc::new(EventRun::new(self.rv, replay));
                    self.inbox.push_back(CacheMsg::Events {
                        run,
                        items: vec![WatchItems { tag, picks: Picks::Range(0, n) }],
                    });
                }
                self.watches.insert(id, (tag, range));
            }
            CacheCmd::Cancel { watch } => {
                self.watches.remove(&watch);
            }
            CacheCmd::Credit { .. } | CacheCmd::RequestProgress => {}
            CacheCmd::Frontier { token, watches, .. } => {
                let caught_up =
                    watches.iter().map(|(t, id)| (*t, self.watches.contains_key(id))).collect();
                self.inbox.push_back(CacheMsg::Frontier { token, cache_rv: self.rv, caught_up });
            }
        }
    }

    /// The cache applies revisions up to `h.rev`.
    fn catch_up(&mut self, h: &History) {
        let events =
            h.events_in(&KeyRange::Range { start: Key::new(b""), end: None }, self.rv, h.rev);
        self.rv = h.rev;
        if events.is_empty() {
            return;
        }
        let run = Arc::new(EventRun::new(self.rv, events.clone()));
        let mut items = Vec::new();
        for (tag, range) in self.watches.values() {
            let mut picks: Option<Picks> = None;
            for (i, e) in events.iter().enumerate() {
                if range.contains(e.key()) {
                    match picks.as_mut() {
                        Some(p) => p.push(i as u32),
                        None => picks = Some(Picks::one(i as u32)),
                    }
                }
            }
            if let Some(picks) = picks {
                items.push(WatchItems { tag: *tag, picks });
            }
        }
        if !items.is_empty() {
            self.inbox.push_back(CacheMsg::Events { run, items });
        }
    }

    /// The watch with this tag falls out of the window.
    fn close(&mut self, tag: WatchTag, cause: CloseCause) {
        self.watches.retain(|_, (t, _)| *t != tag);
        self.inbox.push_back(CacheMsg::Closed { tag, cause, message: None });
    }
}

struct FakeEtcd {
    up: bool,
    /// Whether progress requests are answered (etcd drops them while a watcher is unsynced).
    answers_progress: bool,
    /// The next progress answer carries this revision (an answer etcd computed before the
    /// request now asked, still on its way).
    stale_progress: Option<u64>,
    compacted: u64,
    /// Creates are refused with this reason (etcd's permission check).
    refuse: Option<String>,
    relays: BTreeMap<RelayId, (KeyRange, u64)>,
    inbox: VecDeque<(RelayId, RelayEvent)>,
    opened: usize,
}

impl FakeEtcd {
    fn new() -> FakeEtcd {
        FakeEtcd {
            up: true,
            answers_progress: true,
            stale_progress: None,
            compacted: 0,
            refuse: None,
            relays: BTreeMap::new(),
            inbox: VecDeque::new(),
            opened: 0,
        }
    }

    fn command(&mut self, cmd: UpstreamCmd, h: &History) {
        match cmd {
            UpstreamCmd::Open { relay, request, .. } => {
                self.opened += 1;
                if !self.up {
                    self.inbox.push_back((
                        relay,
                        RelayEvent::Ended {
                            error: Some("connection refused".into()),
                            unavailable: true,
                        },
                    ));
                    return;
                }
                let Some(PbWatchRequestUnion::CreateRequest(c)) = request.request_union else {
                    return;
                };
                if let Some(reason) = &self.refuse {
                    let mut r = resp(-1, h.rev, true);
                    r.canceled = true;
                    r.cancel_reason = reason.clone();
                    self.inbox.push_back((relay, RelayEvent::Response(Box::new(r))));
                    return;
                }
                let range = crate::keys::watch_key_range(&c.key, &c.range_end).expect("range");
                let start = if c.start_revision == 0 { h.rev + 1 } else { c.start_revision as u64 };
                self.inbox.push_back((relay, RelayEvent::Response(Box::new(resp(0, h.rev, true)))));
                if start < self.compacted {
                    let mut r = resp(0, 0, false);
                    r.canceled = true;
                    r.compact_revision = self.compacted as i64;
                    self.inbox.push_back((relay, RelayEvent::Response(Box::new(r))));
                    return;
                }
                self.relays.insert(relay, (range, start - 1));
                self.catch_up_relay(relay, h);
            }
            UpstreamCmd::Progress { relay } => {
                if self.answers_progress && self.relays.contains_key(&relay) {
                    let rev = self.stale_progress.take().unwrap_or(h.rev);
                    self.inbox
                        .push_back((relay, RelayEvent::Response(Box::new(resp(-1, rev, false)))));
                }
            }
            UpstreamCmd::Close { relay } => {
                self.relays.remove(&relay);
            }
        }
    }

    fn catch_up_relay(&mut self, relay: RelayId, h: &History) {
        let Some((range, sent)) = self.relays.get_mut(&relay) else { return };
        for (rev, evs) in &h.revisions {
            if *rev <= *sent {
                continue;
            }
            let mine: Vec<_> = evs
                .iter()
                .filter(|e| range.contains(e.key()))
                .map(|e| pb_event(e, false))
                .collect();
            if !mine.is_empty() {
                let mut r = resp(0, *rev, false);
                r.events = mine;
                self.inbox.push_back((relay, RelayEvent::Response(Box::new(r))));
            }
        }
        *sent = h.rev;
    }

    fn catch_up(&mut self, h: &History) {
        let relays: Vec<RelayId> = self.relays.keys().copied().collect();
        for r in relays {
            self.catch_up_relay(r, h);
        }
    }

    fn go_down(&mut self) {
        self.up = false;
        for relay in std::mem::take(&mut self.relays).into_keys() {
            self.inbox.push_back((
                relay,
                RelayEvent::Ended { error: Some("unavailable".into()), unavailable: true },
            ));
        }
    }
}

fn resp(watch_id: i64, rev: u64, created: bool) -> PbWatchResponse {
    PbWatchResponse {
        header: Some(etcd_client::proto::PbResponseHeader {
            revision: rev as i64,
            cluster_id: 1,
            ..Default::default()
        }),
        watch_id,
        created,
        ..Default::default()
    }
}

/// What the client saw, simplified.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Created { id: i64, canceled: bool },
    Canceled { id: i64, compact: i64 },
    Progress { id: i64, rev: u64 },
    Events { id: i64, revs: Vec<u64> },
}

struct World {
    s: WatchSession,
    h: History,
    cache: FakeCache,
    etcd: FakeEtcd,
    now: Timestamp,
    seen: Vec<Seen>,
    notes: Vec<Note>,
    /// Permission checks: refused with this reason, else allowed.
    deny: Option<String>,
    /// Permission checks held here (answered by the test) instead of answered at once.
    held_checks: Option<Vec<u64>>,
    /// Permission checks answered `Unknown` (etcd could not be asked), whatever `deny` says.
    unknown_checks: bool,
    /// Every response as it went out, with its fragment flag.
    wire: Vec<Wire>,
    /// The cancel reason of every canceled response, in order.
    reasons: Vec<String>,
    /// The session ended the stream, with this reason.
    ended: Option<String>,
    /// The header revision of every `created` response, with its watch id.
    created_at: Vec<(i64, u64)>,
}

const PREFIX: &str = "/registry/";

impl World {
    fn new(cfg: SessionConfig) -> World {
        let mut h = History::default();
        for i in 0..10 {
            h.put(&[&format!("/registry/a{i}")]);
        }
        let cache = FakeCache::new(h.rev, 1);
        let view = CacheView { prefix: Arc::from(PREFIX.as_bytes()), status: cache.status() };
        let s = WatchSession::new(cfg, vec![view], Timestamp::ZERO);
        World {
            s,
            h,
            cache,
            etcd: FakeEtcd::new(),
            now: Timestamp::ZERO,
            seen: Vec::new(),
            notes: Vec::new(),
            deny: None,
            held_checks: None,
            unknown_checks: false,
            wire: Vec::new(),
            reasons: Vec::new(),
            ended: None,
            created_at: Vec::new(),
        }
    }

    /// A world whose session checks permissions (auth on).
    fn checked() -> World {
        World::new(SessionConfig { check_permissions: true, ..World::cfg() })
    }

    fn cfg() -> SessionConfig {
        SessionConfig { create_wait_ms: 0, ..SessionConfig::default() }
    }

    /// Carries out the session's outputs (fakes answer into their inboxes).
    fn outputs(&mut self) {
        while let Some(o) = self.s.poll_output() {
            match o {
                SessionOutput::Respond(r) => {
                    self.wire.push(wire_of(&r));
                    if let Response::Message(m) = &r {
                        if m.canceled {
                            self.reasons.push(m.cancel_reason.clone());
                        }
                        if m.created {
                            let rev = m.header.as_ref().map_or(0, |h| h.revision as u64);
                            self.created_at.push((m.watch_id, rev));
                        }
                    }
                    self.seen.push(seen(r))
                }
                SessionOutput::Cache { cmd, .. } => self.cache.command(cmd, &self.h),
                SessionOutput::Upstream(cmd) => self.etcd.command(cmd, &self.h),
                SessionOutput::CheckPermission { token, .. } => match &mut self.held_checks {
                    Some(held) => held.push(token),
                    None => {
                        let d = match &self.deny {
                            _ if self.unknown_checks => Permission::Unknown,
                            Some(reason) => Permission::Denied(reason.clone()),
                            None => Permission::Allowed,
                        };
                        self.s.handle_permission(self.now, token, d)
                    }
                },
                SessionOutput::Note(n) => self.notes.push(n),
                SessionOutput::End(reason) => {
                    assert!(self.ended.is_none(), "the stream ends once");
                    self.ended = Some(reason);
                }
            }
        }
        self.s.handle_cache_status(0, self.cache.status());
    }

    /// Delivers every message until nothing moves.
    fn pump(&mut self) {
        loop {
            self.outputs();
            if let Some(m) = self.cache.inbox.pop_front() {
                self.s.handle_cache(self.now, m);
                continue;
            }
            if let Some((r, ev)) = self.etcd.inbox.pop_front() {
                self.s.handle_relay(self.now, r, ev);
                continue;
            }
            break;
        }
    }

    fn request(&mut self, u: PbWatchRequestUnion) {
        self.s.handle_request(self.now, PbWatchRequest { request_union: Some(u) });
        self.outputs();
    }

    fn create(&mut self, key: &str, end: &str, start: i64, id: i64) {
        let mut c = etcd_client::proto::PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
        };
        if let Some(PbWatchRequestUnion::CreateRequest(cr)) = c.request_union.as_mut() {
            cr.key = key.as_bytes().to_vec();
            cr.range_end = end.as_bytes().to_vec();
            cr.start_revision = start;
            cr.watch_id = id;
        }
        self.request(c.request_union.expect("set"));
    }

    /// A create with `fragment` set.
    fn create_fragmented(&mut self, key: &str, end: &str, start: i64) {
        let mut u = PbWatchRequestUnion::CreateRequest(Default::default());
        if let PbWatchRequestUnion::CreateRequest(cr) = &mut u {
            cr.key = key.as_bytes().to_vec();
            cr.range_end = end.as_bytes().to_vec();
            cr.start_revision = start;
            cr.fragment = true;
        }
        self.request(u);
    }

    /// etcd's response to the session's only relay, with the events of revision `rev` under
    /// `prefix`, from the `skip`th on, `take` of them, marked as a fragment or not.
    fn relay_fragment(&mut self, rev: u64, prefix: &str, skip: usize, take: usize, fragment: bool) {
        let relay = *self.etcd.relays.keys().next().expect("one relay");
        let evs = &self.h.revisions.iter().find(|(r, _)| *r == rev).expect("revision").1;
        let mut r = resp(0, rev, false);
        r.events = evs
            .iter()
            .filter(|e| e.key().starts_with(prefix.as_bytes()))
            .skip(skip)
            .take(take)
            .map(|e| pb_event(e, false))
            .collect();
        r.fragment = fragment;
        self.s.handle_relay(self.now, relay, RelayEvent::Response(Box::new(r)));
        self.outputs();
    }

    fn watch_prefix(&mut self, start: i64) {
        self.create(PREFIX, "/registry0", start, 0);
    }

    fn cancel_id(&mut self, id: i64) {
        let mut r = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::CancelRequest(Default::default())),
        };
        if let Some(PbWatchRequestUnion::CancelRequest(c)) = r.request_union.as_mut() {
            c.watch_id = id;
        }
        self.s.handle_request(self.now, r);
        self.outputs();
    }

    fn progress(&mut self) {
        self.request(PbWatchRequestUnion::ProgressRequest(Default::default()));
    }

    fn advance(&mut self, ms: u64) {
        let target = self.now.add_ms(ms);
        while let Some((t, _)) = self.s.poll_timeout() {
            if t > target {
                break;
            }
            self.now = t.max(self.now);
            self.s.handle_timeout(self.now);
            self.pump();
        }
        self.now = target;
        self.s.handle_timeout(self.now);
        self.pump();
    }

    /// A write that both the cache and etcd see.
    fn write(&mut self, keys: &[&str]) -> u64 {
        let rev = self.h.put(keys);
        self.cache.catch_up(&self.h);
        self.etcd.catch_up(&self.h);
        rev
    }

    fn take(&mut self) -> Vec<Seen> {
        std::mem::take(&mut self.seen)
    }

    /// Every event revision the client got for watch `id`, in order.
    fn revs_of(seen: &[Seen], id: i64) -> Vec<u64> {
        seen.iter()
            .filter_map(|s| match s {
                Seen::Events { id: i, revs } if *i == id => Some(revs.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }
}

/// A response as it went out: enough to reassemble fragments as clientv3 does.
#[derive(Clone, Debug)]
struct Wire {
    id: i64,
    revs: Vec<u64>,
    fragment: bool,
    /// Created or canceled.
    control: bool,
}

fn wire_of(r: &Response) -> Wire {
    match r {
        Response::Events(e) => {
            Wire { id: e.watch_id, revs: revs(r), fragment: e.fragment, control: false }
        }
        Response::Message(m) => Wire {
            id: m.watch_id,
            revs: revs(r),
            fragment: m.fragment,
            control: m.created || m.canceled,
        },
    }
}

/// The revisions of a response's events, in order.
fn revs(r: &Response) -> Vec<u64> {
    match r {
        Response::Events(e) => {
            e.picks.iter().filter_map(|i| e.run.event(i)).map(|ev| ev.rv()).collect()
        }
        Response::Message(m) => {
            m.events.iter().filter_map(|e| e.kv.as_ref()).map(|kv| kv.mod_revision as u64).collect()
        }
    }
}

/// Each watch's events as clientv3 hands them on (`watchGrpcStream.run`): a fragment opens a
/// response that only the same watch's next responses are merged into, up to the one that is
/// not a fragment. Any other response while one is open is an error here: clientv3 drops it
/// (another watch's events, a progress notification) or the open fragments (a `created`).
fn clientv3(wire: &[Wire]) -> Result<BTreeMap<i64, Vec<u64>>, String> {
    let mut out: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    let mut open: Option<(i64, Vec<u64>)> = None;
    for (i, r) in wire.iter().enumerate() {
        if let Some((id, revs)) = open.as_mut() {
            if r.id != *id || r.control {
                return Err(format!("response {i} {r:?} between the fragments of watch {id}'s"));
            }
            revs.extend(&r.revs);
            if !r.fragment {
                let (id, revs) = open.take().expect("open");
                out.entry(id).or_default().extend(revs);
            }
        } else if r.fragment && !r.control {
            open = Some((r.id, r.revs.clone()));
        } else {
            out.entry(r.id).or_default().extend(&r.revs);
        }
    }
    Ok(out)
}

fn seen(r: Response) -> Seen {
    let revs = revs(&r);
    match r {
        Response::Events(e) => Seen::Events { id: e.watch_id, revs },
        Response::Message(m) if m.created => Seen::Created { id: m.watch_id, canceled: m.canceled },
        Response::Message(m) if m.canceled => {
            Seen::Canceled { id: m.watch_id, compact: m.compact_revision }
        }
        Response::Message(m) if m.events.is_empty() => {
            Seen::Progress { id: m.watch_id, rev: m.header.map_or(0, |h| h.revision as u64) }
        }
        Response::Message(m) => Seen::Events { id: m.watch_id, revs },
    }
}

// ----- watch ids --------------------------------------------------------------------------------

#[test]
fn auto_watch_ids_are_never_reused_on_a_stream() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    w.watch_prefix(0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: 0, canceled: false }, Seen::Created { id: 1, canceled: false }]
    );
    w.cancel_id(0);
    w.watch_prefix(0);
    w.pump();
    let seen = w.take();
    assert_eq!(seen[0], Seen::Canceled { id: 0, compact: 0 });
    assert_eq!(seen[1], Seen::Created { id: 2, canceled: false }, "id 0 must not come back");
    // A client-chosen id: refused while in use, allowed once free (as etcd does).
    w.create(PREFIX, "/registry0", 0, 2);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: -1, canceled: true }]);
    w.create(PREFIX, "/registry0", 0, 0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 3, canceled: false }]);
}

/// Reliability finding 4: the server cancels watch 0 (compaction), the client creates another
/// and then sends its automatic cancel for the old 0: the new watch must live on, and the
/// cancel is answered as etcd answers it (its watchStream still holds the compacted watcher).
#[test]
fn a_late_cancel_for_a_server_cancelled_id_does_not_end_the_next_watch() {
    let mut w = World::new(World::cfg());
    w.etcd.compacted = 5;
    // Outside the prefix: served by etcd, which cancels it as compacted.
    w.create("/other", "", 2, 0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: 0, canceled: false }, Seen::Canceled { id: 0, compact: 5 }]
    );
    assert!(w.notes.contains(&Note::Compacted(5)));
    w.watch_prefix(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 1, canceled: false }]);
    w.cancel_id(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Canceled { id: 0, compact: 0 }]);
    w.cancel_id(0);
    w.pump();
    assert!(w.take().is_empty(), "a cancel of an unknown id gets no answer");
    let rev = w.write(&["/registry/x"]);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Events { id: 1, revs: vec![rev] }]);
}

/// Found by `random_slow_readers_match_etcd`: a watch etcd canceled as compacted keeps its id
/// on the stream until the client cancels it (etcd's `watchStream` holds the watcher), so the
/// next automatic id skips it and a create that asks for it is a duplicate.
#[test]
fn a_watch_canceled_as_compacted_keeps_its_id_until_the_client_cancels_it() {
    let mut w = World::new(World::cfg());
    w.etcd.compacted = 5;
    w.create("/other", "", 2, 2);
    w.pump();
    w.watch_prefix(0);
    w.watch_prefix(0);
    w.watch_prefix(0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 2, canceled: false },
            Seen::Canceled { id: 2, compact: 5 },
            Seen::Created { id: 0, canceled: false },
            Seen::Created { id: 1, canceled: false },
            Seen::Created { id: 3, canceled: false },
        ],
        "the third automatic id skips the compacted watch's"
    );
    w.create(PREFIX, "/registry0", 0, 2);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: -1, canceled: true }], "2 is still taken");
    w.cancel_id(2);
    w.create(PREFIX, "/registry0", 0, 2);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Canceled { id: 2, compact: 0 }, Seen::Created { id: 2, canceled: false }]
    );
}

/// etcd drops every progress request while its stream holds a watcher it ended as compacted
/// (`progressIfSync` finds it in neither of its groups), until the client cancels that watch,
/// as clientv3 does once its reader takes the compacted response. Neither does watchcache
/// answer: not a request that comes while the watch is held, nor one that was out when etcd
/// ended the watch.
#[test]
fn no_progress_is_answered_while_a_watch_ended_as_compacted_is_held() {
    let mut w = World::new(World::cfg());
    w.etcd.compacted = 5;
    w.watch_prefix(0);
    w.pump();
    // Outside the prefix: served by etcd, which ends it as compacted.
    w.create("/other", "", 2, 0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 0, canceled: false },
            Seen::Created { id: 1, canceled: false },
            Seen::Canceled { id: 1, compact: 5 },
        ]
    );
    let rev = w.write(&["/registry/x"]);
    w.progress();
    w.pump();
    w.advance(5_000);
    assert_eq!(w.take(), vec![Seen::Events { id: 0, revs: vec![rev] }], "1 is held");
    w.cancel_id(1);
    w.progress();
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Canceled { id: 1, compact: 0 }, Seen::Progress { id: -1, rev }]
    );

    // Asked while the create that etcd ends is still out: no answer either.
    let rev = w.write(&["/registry/y"]);
    w.create("/other", "", 2, 0);
    w.progress();
    w.pump();
    w.advance(5_000);
    assert_eq!(
        w.take(),
        vec![
            Seen::Events { id: 0, revs: vec![rev] },
            Seen::Created { id: 2, canceled: false },
            Seen::Canceled { id: 2, compact: 5 },
        ]
    );
}

/// Found in review: etcd takes a cancel before it reads the next request (`watchStream.Cancel`
/// frees the id at once), so a create of the id just canceled is a new watch, not a duplicate,
/// also while the canceled watch is not yet announced (its answer still on its way); and an
/// automatic id that reaches a canceled one gets it, as etcd's `nextID` finds it free.
#[test]
fn an_id_canceled_before_its_watch_is_announced_is_free_for_the_next_create() {
    let mut w = World::new(World::cfg());
    w.create(PREFIX, "/registry0", 0, 5);
    w.cancel_id(5);
    w.create(PREFIX, "/registry0", 0, 5);
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 5, canceled: false },
            Seen::Canceled { id: 5, compact: 0 },
            Seen::Created { id: 5, canceled: false },
        ]
    );
    let rev = w.write(&["/registry/x"]);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Events { id: 5, revs: vec![rev] }]);
    // Automatic ids: 0 and 1, then 2, canceled before its announcement, is free again.
    w.create(PREFIX, "/registry0", 0, 2);
    w.cancel_id(2);
    for _ in 0..3 {
        w.watch_prefix(0);
    }
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 2, canceled: false },
            Seen::Canceled { id: 2, compact: 0 },
            Seen::Created { id: 0, canceled: false },
            Seen::Created { id: 1, canceled: false },
            Seen::Created { id: 2, canceled: false },
        ]
    );
    assert!(w.s.takes_requests());
    // An automatic id that cannot reach the canceled one does not wait for its cancel.
    w.create(PREFIX, "/registry0", 0, 100);
    w.cancel_id(100);
    w.watch_prefix(0);
    assert!(w.s.takes_requests(), "the automatic create (id 3) was taken at once");
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 100, canceled: false },
            Seen::Canceled { id: 100, compact: 0 },
            Seen::Created { id: 3, canceled: false },
        ]
    );
}

/// A create refused once taken (here: permission denied) is answered as etcd answers it, with
/// id -1, and takes no id; the requests after it wait for its outcome (etcd's recvLoop checks
/// a create before it reads on), so the next create gets the id the refused one would have.
#[test]
fn a_refused_create_takes_no_id_and_the_next_requests_wait_for_its_outcome() {
    let mut w = World::checked();
    w.held_checks = Some(Vec::new());
    w.watch_prefix(0);
    w.watch_prefix(0);
    w.cancel_id(0);
    w.pump();
    assert!(w.take().is_empty());
    assert!(!w.s.takes_requests(), "requests wait behind the undecided create");
    let held = w.held_checks.take().expect("held");
    assert_eq!(held.len(), 1, "the second create is not taken before the first is decided");
    w.s.handle_permission(w.now, held[0], Permission::Denied("permission denied".into()));
    w.pump();
    // The cancel, taken after both creates, ends the watch that got id 0.
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: -1, canceled: true },
            Seen::Created { id: 0, canceled: false },
            Seen::Canceled { id: 0, compact: 0 }
        ],
        "the refused create took no id"
    );
    assert!(w.s.takes_requests());
}

/// Found in review: a refused create that had skipped ids in use puts the next automatic id
/// back where it was (etcd's `nextID` never moved), not at the id it was given: once the id it
/// skipped is free, the next create gets it, as from etcd.
#[test]
fn a_refused_create_puts_the_next_automatic_id_back_where_it_was() {
    let mut w = World::checked();
    w.create(PREFIX, "/registry0", 0, 1);
    w.watch_prefix(0);
    w.pump();
    w.deny = Some(PERMISSION_DENIED.into());
    w.watch_prefix(0);
    w.pump();
    w.deny = None;
    w.cancel_id(1);
    w.watch_prefix(0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 1, canceled: false },
            Seen::Created { id: 0, canceled: false },
            Seen::Created { id: -1, canceled: true },
            Seen::Canceled { id: 1, compact: 0 },
            Seen::Created { id: 1, canceled: false },
        ]
    );
}

/// etcd checks a create's permission before its range and its id (`isWatchPermitted` comes
/// before `watchStream.Watch` in `recvLoop`): a client that may not read gets the permission
/// refusal for an empty range or a duplicate id too, and one that may gets etcd's own words.
#[test]
fn with_permissions_checked_a_malformed_create_is_refused_for_permission_first() {
    let mut w = World::checked();
    w.create(PREFIX, "/registry0", 0, 7);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 7, canceled: false }]);
    w.deny = Some("etcdserver: permission denied".into());
    w.create("/registry/b", "/registry/a", 0, 0);
    w.create(PREFIX, "/registry0", 0, 7);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: -1, canceled: true }, Seen::Created { id: -1, canceled: true }]
    );
    assert_eq!(w.reasons, vec!["etcdserver: permission denied"; 2]);
    w.reasons.clear();
    w.deny = None;
    w.held_checks = Some(Vec::new());
    w.create("/registry/b", "/registry/a", 0, 0);
    w.create(PREFIX, "/registry0", 0, 7);
    w.pump();
    assert!(w.take().is_empty(), "the refusal waits for the permission");
    let held = w.held_checks.take().expect("held");
    assert_eq!(held.len(), 1, "the next create waits behind the undecided one");
    w.s.handle_permission(w.now, held[0], Permission::Allowed);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: -1, canceled: true }, Seen::Created { id: -1, canceled: true }]
    );
    assert_eq!(w.reasons, vec![ERR_EMPTY_RANGE, ERR_DUPLICATE_ID]);
}

/// etcd answers a cancel and the creates around it on one channel, in request order: the
/// cancel of a watch not yet announced is answered right after its `created`, before the
/// answer to a create sent after the cancel (it came after that answer before).
#[test]
fn a_cancel_before_a_create_is_answered_before_that_creates_answer() {
    let mut w = World::checked();
    w.held_checks = Some(Vec::new());
    w.watch_prefix(0);
    w.cancel_id(0);
    w.watch_prefix(0);
    let held = std::mem::take(w.held_checks.as_mut().expect("held"));
    assert_eq!(held.len(), 1);
    // Allowed: the cache starts it (its answer still in the cache's inbox), and the requests
    // behind it are taken: the cancel, then the second create, which etcd refuses.
    w.s.handle_permission(w.now, held[0], Permission::Allowed);
    w.outputs();
    let held = w.held_checks.take().expect("held");
    assert_eq!(held.len(), 1, "the second create's check");
    w.s.handle_permission(w.now, held[0], Permission::Denied(PERMISSION_DENIED.into()));
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Created { id: 0, canceled: false },
            Seen::Canceled { id: 0, compact: 0 },
            Seen::Created { id: -1, canceled: true },
        ]
    );
}

/// With permissions checked, a create etcd could not be asked about (etcd down: the check
/// fails, and so does the relay through which etcd would decide) is neither announced nor
/// served from the cache: it waits, and the requests behind it with it, until etcd decides,
/// and etcd's refusal is the answer. Found by the robustness suite's auth mode: a user who may
/// not read the secrets watched one while etcd was down, got `created` when the relay failed,
/// and was then served from the cache.
#[test]
fn a_create_whose_permission_etcd_could_not_decide_waits_for_etcd() {
    let mut w = World::checked();
    w.etcd.go_down();
    w.unknown_checks = true;
    w.create("/registry/a1", "", 0, 0);
    w.create("/other/k", "", 0, 0);
    w.pump();
    w.advance(10_000);
    assert!(w.take().is_empty(), "nothing is said before etcd decides");
    assert!(!w.s.takes_requests(), "requests wait behind the undecided create");
    assert!(w.etcd.opened >= 2, "etcd is asked again: {} relays", w.etcd.opened);
    // etcd is back, and refuses.
    w.etcd.up = true;
    w.unknown_checks = false;
    w.deny = Some(PERMISSION_DENIED.into());
    w.write(&["/registry/a1", "/other/k"]);
    w.advance(10_000);
    let seen = w.take();
    assert_eq!(
        seen[..2],
        [Seen::Created { id: -1, canceled: true }, Seen::Created { id: 0, canceled: false }],
        "etcd's refusal, then the next create, which gets the first id: {seen:?}"
    );
    assert_eq!(w.reasons, vec![PERMISSION_DENIED]);
    assert!(seen[2..].iter().all(|s| !matches!(s, Seen::Events { id, .. } if *id != 0)));
    // Allowed once etcd is back: served as any permitted watch.
    let mut w = World::checked();
    w.etcd.go_down();
    w.unknown_checks = true;
    w.create("/registry/a1", "", 0, 0);
    w.advance(5_000);
    assert!(w.take().is_empty());
    w.etcd.up = true;
    w.unknown_checks = false;
    w.advance(10_000);
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    let rev = w.write(&["/registry/a1"]);
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![rev]);
}

/// The same for a create etcd's watch store would refuse (a duplicate id): etcd asks the
/// permission first, so nothing is answered before it can, and a client that may not read
/// the range hears "permission denied" (it heard the id's refusal at once before).
#[test]
fn a_malformed_create_whose_permission_etcd_could_not_decide_waits_for_etcd() {
    let mut w = World::checked();
    w.create(PREFIX, "/registry0", 0, 7);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 7, canceled: false }]);
    w.unknown_checks = true;
    w.create(PREFIX, "/registry0", 0, 7);
    w.cancel_id(7);
    w.pump();
    w.advance(10_000);
    assert!(w.take().is_empty(), "nothing is said before etcd decides");
    assert!(!w.s.takes_requests(), "requests wait behind the undecided create");
    w.unknown_checks = false;
    w.deny = Some(PERMISSION_DENIED.into());
    w.advance(10_000);
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: -1, canceled: true }, Seen::Canceled { id: 7, compact: 0 }],
        "etcd's refusal, then the cancel taken after it"
    );
    assert_eq!(w.reasons, vec![PERMISSION_DENIED, ""]);
    assert!(w.s.takes_requests());
}

const PERMISSION_DENIED: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

const INVALID_TOKEN: &str =
    "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token";

/// etcd forgets simple tokens when it restarts (and expires unused ones), and breaks every
/// stream when it restarts, so its clients authenticate again. A client's stream to the cache
/// outlives the restart: once etcd refuses as unknown a token it took on this stream, the
/// stream ends as a broken one does, and the client comes back with a fresh token.
#[test]
fn a_token_etcd_forgot_after_taking_it_ends_the_stream() {
    let mut w = World::checked();
    w.watch_prefix(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    w.deny = Some(INVALID_TOKEN.into());
    w.watch_prefix(0);
    w.pump();
    assert!(w.take().is_empty(), "no refusal: the stream ends");
    assert!(w.ended.is_some(), "the stream ends");
    // A relayed create refused by etcd for the same reason ends the stream too.
    let mut w = World::checked();
    w.watch_prefix(0);
    w.pump();
    w.take();
    w.etcd.refuse = Some(INVALID_TOKEN.into());
    w.create("/other", "", 0, 0);
    w.pump();
    assert!(w.take().is_empty(), "no refusal: the stream ends");
    assert!(w.ended.is_some());
}

/// Without permission checks of its own (a library cache), a create etcd serves can still be
/// refused by etcd (the cache's user may not read that range): etcd's `nextID` does not move
/// for it, so the next automatic id is the one the refused create would have had. The next
/// request waits for etcd's answer, as etcd's `recvLoop` decides one create before the next.
#[test]
fn a_create_etcd_refuses_leaves_the_next_automatic_id_as_etcd_does() {
    let mut w = World::new(World::cfg());
    w.etcd.refuse = Some("etcdserver: permission denied".into());
    w.create("/other", "", 0, 0);
    w.watch_prefix(0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: -1, canceled: true }, Seen::Created { id: 0, canceled: false }]
    );
}

/// A token etcd never took on this stream is refused as etcd refuses it: the create is
/// canceled and the stream goes on.
#[test]
fn a_token_never_taken_is_refused_as_etcd_refuses_it() {
    let mut w = World::checked();
    w.deny = Some(INVALID_TOKEN.into());
    w.watch_prefix(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: -1, canceled: true }]);
    assert_eq!(w.reasons, vec![INVALID_TOKEN]);
    assert!(w.ended.is_none());
}

/// After an outage of etcd this stream outlived, a token refused as unknown ends the stream,
/// taken on it or not: over etcd itself, a restart would have broken it (found by the
/// robustness suite: a stream that had only asked for progress when etcd restarted).
#[test]
fn after_an_outage_the_stream_outlived_a_token_refused_as_unknown_ends_it() {
    let mut w = World::checked();
    w.deny = Some(INVALID_TOKEN.into());
    w.s.handle_upstream_outage();
    w.watch_prefix(0);
    w.pump();
    assert!(w.take().is_empty(), "no refusal: the stream ends");
    assert!(w.ended.is_some());
}

/// etcd answers a client's cancel on the same control channel as its `created` responses, in
/// request order: a cancel sent after a create is answered after that create's `created`.
#[test]
fn a_cancel_is_answered_after_the_created_of_a_create_sent_before_it() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    // Outside the prefix: its `created` waits for etcd's answer, not yet delivered.
    w.create("/other", "", 0, 0);
    w.cancel_id(0);
    assert!(w.take().is_empty(), "the cancel's answer waits for the created before it");
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: 1, canceled: false }, Seen::Canceled { id: 0, compact: 0 }]
    );
}

#[test]
fn created_responses_come_in_request_order() {
    let mut w = World::new(World::cfg());
    // A pass-through create first (etcd answers later), then a cached one.
    w.create("/other", "", 0, 0);
    w.watch_prefix(0);
    // The cache answers at once; etcd has not: nothing may overtake the first `created`.
    while let Some(m) = w.cache.inbox.pop_front() {
        w.s.handle_cache(w.now, m);
        w.outputs();
    }
    assert!(w.take().is_empty(), "the second watch's created must wait for the first's");
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: 0, canceled: false }, Seen::Created { id: 1, canceled: false }]
    );
    let rev = w.write(&["/registry/y"]);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Events { id: 1, revs: vec![rev] }]);
}

// ----- framing ----------------------------------------------------------------------------------

/// Reliability finding 2, at the session: responses hold whole revisions, however they are
/// sized.
#[test]
fn responses_never_split_a_revision() {
    let mut w = World::new(SessionConfig { max_response_bytes: 1, ..World::cfg() });
    w.watch_prefix(0);
    w.pump();
    w.take();
    let r1 = w.write(&["/registry/t1", "/registry/t2", "/registry/t3"]);
    let r2 = w.write(&["/registry/t4"]);
    w.pump();
    assert_eq!(
        w.take(),
        vec![
            Seen::Events { id: 0, revs: vec![r1, r1, r1] },
            Seen::Events { id: 0, revs: vec![r2] }
        ]
    );
}

// ----- progress ---------------------------------------------------------------------------------

/// Reliability finding 3: a progress answer must wait for every watch on the stream, including
/// one whose relay is starting, ended, or restarting; and it is never below what the stream
/// already vouched for.
#[test]
fn progress_waits_for_relays_that_start_end_and_restart() {
    let mut w = World::new(World::cfg());
    // Watch 0 on the cache; watch 1 from an old revision, relayed (the cache's window starts
    // at 8).
    w.cache.oldest = 8;
    w.watch_prefix(0);
    w.create("/registry/a1", "", 2, 0);
    // etcd has not answered watch 1's create yet.
    while let Some(m) = w.cache.inbox.pop_front() {
        w.s.handle_cache(w.now, m);
        w.outputs();
    }
    w.progress();
    while let Some(m) = w.cache.inbox.pop_front() {
        w.s.handle_cache(w.now, m);
        w.outputs();
    }
    assert!(
        !w.take().iter().any(|s| matches!(s, Seen::Progress { .. })),
        "no answer while a relay is opening"
    );
    // The relay opens; then it breaks before answering (its end is what the session sees next).
    let (relay, created) = w.etcd.inbox.pop_front().expect("created");
    w.s.handle_relay(w.now, relay, created);
    w.outputs();
    w.etcd.inbox.clear();
    w.etcd.relays.clear();
    w.s.handle_relay(w.now, relay, RelayEvent::Ended { error: None, unavailable: true });
    w.pump();
    w.advance(50);
    assert!(
        !w.take().iter().any(|s| matches!(s, Seen::Progress { .. })),
        "no answer for a watch between sources"
    );
    // The relay comes back and catches up; only then is progress answered, at a revision every
    // watch has reached.
    w.advance(3_000);
    let seen = w.take();
    let progress: Vec<u64> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Progress { id: -1, rev } => Some(*rev),
            _ => None,
        })
        .collect();
    assert_eq!(progress, vec![w.h.rev], "{seen:?}");
    let relayed = World::revs_of(&seen, 1);
    assert_eq!(relayed, vec![2], "watch 1 got its one event before the answer: {seen:?}");
    let at = seen.iter().position(|s| matches!(s, Seen::Progress { .. })).expect("answer");
    let ev = seen.iter().position(|s| matches!(s, Seen::Events { id: 1, .. })).expect("event");
    assert!(ev < at, "the event comes before the progress that vouches for it: {seen:?}");
}

#[test]
fn progress_is_never_below_what_the_stream_vouched_for() {
    let mut w = World::new(World::cfg());
    w.cache.oldest = 8;
    w.watch_prefix(0);
    w.create("/registry/a1", "", 2, 0);
    w.pump();
    w.take();
    // The cache is ahead of etcd's answers for the relay: etcd answers late, at a lower
    // revision than the cached watch already got.
    let rev = w.write(&["/registry/b"]);
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![rev]);
    w.etcd.answers_progress = false;
    w.progress();
    w.pump();
    w.advance(1_000);
    assert!(
        w.take().iter().all(|s| !matches!(s, Seen::Progress { .. })),
        "no answer without the relay's"
    );
    w.etcd.answers_progress = true;
    w.advance(1_000);
    let progress: Vec<u64> = w
        .take()
        .iter()
        .filter_map(|s| match s {
            Seen::Progress { id: -1, rev } => Some(*rev),
            _ => None,
        })
        .collect();
    assert_eq!(progress, vec![rev]);
}

#[test]
fn progress_on_an_idle_stream_and_with_cached_watches() {
    let mut w = World::new(World::cfg());
    // No watch on the stream: etcd has no watcher to answer for, and sends nothing.
    w.progress();
    w.pump();
    w.advance(5_000);
    assert_eq!(w.take(), vec![]);
    w.watch_prefix(0);
    w.pump();
    w.take();
    let rev = w.write(&["/registry/z"]);
    w.progress();
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Events { id: 0, revs: vec![rev] }, Seen::Progress { id: -1, rev }]
    );
}

#[test]
fn periodic_progress_for_idle_cached_watches() {
    let mut w = World::new(SessionConfig { progress_notify_interval_ms: 1_000, ..World::cfg() });
    let mut c = etcd_client::proto::PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    };
    if let Some(PbWatchRequestUnion::CreateRequest(cr)) = c.request_union.as_mut() {
        cr.key = PREFIX.as_bytes().to_vec();
        cr.range_end = b"/registry0".to_vec();
        cr.progress_notify = true;
    }
    w.request(c.request_union.expect("set"));
    w.pump();
    w.take();
    w.advance(1_100);
    assert_eq!(w.take(), vec![Seen::Progress { id: 0, rev: 10 }]);
    // Events since the last tick: no notification at the next one.
    w.advance(500);
    let rev = w.write(&["/registry/q"]);
    w.pump();
    w.advance(600);
    assert_eq!(w.take(), vec![Seen::Events { id: 0, revs: vec![rev] }]);
    w.advance(1_000);
    assert_eq!(w.take(), vec![Seen::Progress { id: 0, rev }]);
}

// ----- moving between cache and etcd ------------------------------------------------------------

#[test]
fn an_old_watch_goes_to_etcd_and_moves_back_onto_the_cache() {
    let mut w = World::new(SessionConfig { rejoin_interval_ms: 100, ..World::cfg() });
    w.cache.oldest = 8;
    w.watch_prefix(3);
    w.pump();
    let seen = w.take();
    assert_eq!(seen[0], Seen::Created { id: 0, canceled: false });
    assert_eq!(World::revs_of(&seen, 0), (3..=10).collect::<Vec<_>>());
    assert!(w.notes.contains(&Note::ServedFromEtcd));
    // Caught up: the next rejoin check moves it onto the cache.
    w.advance(150);
    assert!(w.notes.contains(&Note::Rejoined), "{:?}", w.notes);
    assert!(w.etcd.relays.is_empty(), "the relay is closed");
    let r = w.write(&["/registry/n"]);
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![r]);
}

#[test]
fn a_cached_watch_that_falls_out_of_the_window_resumes_from_etcd_without_a_gap() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    w.pump();
    w.take();
    let r1 = w.write(&["/registry/c1"]);
    w.pump();
    // The cache moves on without the watch (it fell behind and out of the window).
    let tag = *w.s.by_tag.keys().next().expect("tag");
    w.cache.watches.clear();
    let r2 = w.h.put(&["/registry/c2"]);
    let r3 = w.h.put(&["/registry/c3"]);
    w.cache.rv = r3;
    w.cache.oldest = r3 + 1;
    w.cache.close(tag, CloseCause::Error);
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![r1, r2, r3]);
}

#[test]
fn a_cached_watch_resumes_on_the_cache_after_a_relist_that_covers_it() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    w.pump();
    w.take();
    let tag = *w.s.by_tag.keys().next().expect("tag");
    w.cache.watches.clear();
    w.cache.close(tag, CloseCause::Reinitializing);
    let r = w.h.put(&["/registry/r"]);
    w.cache.rv = r;
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![r]);
    assert!(!w.notes.contains(&Note::ServedFromEtcd));
}

// ----- etcd unreachable -------------------------------------------------------------------------

/// Reliability finding 5: a create that must go to etcd while etcd is down is not refused: it
/// is announced, and served once etcd is back, from the revision it was announced at.
#[test]
fn creates_while_etcd_is_down_wait_and_retry() {
    let mut w = World::new(World::cfg());
    w.etcd.go_down();
    w.create("/other/k", "", 0, 0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    w.advance(2_000);
    assert!(w.take().is_empty());
    let opened = w.etcd.opened;
    assert!(opened >= 2, "tried again: {opened}");
    // etcd is back; a write to the key is delivered (nothing between the announcement and
    // etcd's return is lost).
    w.etcd.up = true;
    let rev = w.write(&["/other/k"]);
    w.advance(3_000);
    assert_eq!(World::revs_of(&w.take(), 0), vec![rev]);
}

/// Found in review: a watch from now whose relay failed (etcd unreachable) is announced by the
/// session, which used to open a relay from the new "now" at once and then put the watch to
/// wait for its retry, forgetting that relay: once etcd answered it, it stayed open on etcd
/// for the stream's life beside the retry's. One relay per watch, whatever the order.
#[test]
fn a_watch_announced_while_etcd_is_down_keeps_one_relay_on_etcd() {
    let mut w = World::new(World::cfg());
    w.etcd.go_down();
    w.create("/other/k", "", 0, 0);
    // etcd is back before the session hears that the first relay failed.
    w.etcd.up = true;
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    w.advance(10_000);
    assert_eq!(w.etcd.relays.len(), 1, "relays open on etcd: {:?}", w.etcd.relays.keys());
    assert_eq!(w.etcd.opened, 2, "the failed relay and its retry, no other");
    let rev = w.write(&["/other/k"]);
    w.advance(1_000);
    assert_eq!(World::revs_of(&w.take(), 0), vec![rev]);
}

/// Found in review: a session that knows no revision yet (no cache has said one) announcing a
/// watch from now while etcd is down took "now" as revision 0, so its retry watched from
/// revision 1 and replayed the whole history; "now" is left for the relay to learn.
#[test]
fn a_watch_from_now_announced_before_any_revision_is_known_replays_no_history() {
    let mut w = World::new(World::cfg());
    w.s = WatchSession::new(World::cfg(), Vec::new(), Timestamp::ZERO);
    w.h.put(&["/other/k"]);
    w.etcd.go_down();
    w.create("/other/k", "", 0, 0);
    w.etcd.up = true;
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    w.advance(10_000);
    assert!(World::revs_of(&w.take(), 0).is_empty(), "no event from before the watch");
    let rev = w.write(&["/other/k"]);
    w.advance(1_000);
    assert_eq!(World::revs_of(&w.take(), 0), vec![rev]);
}

#[test]
fn a_relayed_watch_whose_etcd_restarts_resumes_after_its_last_revision() {
    let mut w = World::new(World::cfg());
    w.create("/other/k", "", 0, 0);
    w.pump();
    w.take();
    let r1 = w.write(&["/other/k"]);
    w.pump();
    w.etcd.go_down();
    w.pump();
    let r2 = w.h.put(&["/other/k"]);
    w.etcd.up = true;
    w.advance(3_000);
    let r3 = w.write(&["/other/k"]);
    w.pump();
    assert_eq!(World::revs_of(&w.take(), 0), vec![r1, r2, r3]);
}

// ----- invalid requests -------------------------------------------------------------------------

#[test]
fn invalid_creates_are_refused_as_etcd_refuses_them() {
    let mut w = World::new(World::cfg());
    w.create("/b", "/a", 0, 0);
    w.create("/a", "", -1, 0);
    w.pump();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: -1, canceled: true }, Seen::Created { id: -1, canceled: true }]
    );
    // No id was used up.
    w.watch_prefix(0);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
}

/// Reliability finding (robustness run): etcd answers no progress request below a watch's
/// start revision (`progressIfSync`: `rev < w.startRev`); clientv3 would otherwise resume such
/// a watch from a revision it never asked for.
#[test]
fn a_future_watch_holds_progress_answers_back_until_its_start() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    w.watch_prefix(13);
    w.pump();
    w.take();
    w.progress();
    w.advance(600);
    assert!(w.take().iter().all(|s| !matches!(s, Seen::Progress { .. })), "10 < 13: no answer yet");
    w.write(&["/registry/x"]);
    w.write(&["/registry/y"]);
    let r = w.write(&["/registry/z"]);
    assert_eq!(r, 13);
    w.advance(600);
    let seen = w.take();
    let progress: Vec<u64> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Progress { id: -1, rev } => Some(*rev),
            _ => None,
        })
        .collect();
    assert_eq!(progress, vec![13], "{seen:?}");
    assert_eq!(World::revs_of(&seen, 1), vec![13]);
}

/// Found in review: etcd's `created` carries its revision now (`v3rpc/watch.go`: the store's
/// revision), also for a watch that starts in the future; watchcache said its start − 1, a
/// revision etcd had not reached. Served from the cache, and announced by the session itself
/// while etcd is down.
#[test]
fn a_future_watch_is_created_at_the_revision_of_now_not_at_its_start() {
    let mut w = World::new(World::cfg());
    let now = w.h.rev;
    w.watch_prefix(1_000);
    w.pump();
    assert_eq!(w.take(), vec![Seen::Created { id: 0, canceled: false }]);
    assert_eq!(w.created_at, vec![(0, now)]);
    w.etcd.go_down();
    w.create("/other/k", "", 1_000, 0);
    w.pump();
    w.advance(2_000);
    assert_eq!(w.take(), vec![Seen::Created { id: 1, canceled: false }]);
    assert_eq!(w.created_at, vec![(0, now), (1, now)]);
}

/// Reliability finding (robustness run): a watch from "now" that the cache registers after it
/// moved on (its start replays what came in between) is created at its start, not at the
/// cache's revision: a client treats the created revision as where its events begin.
#[test]
fn a_watch_from_now_is_created_at_where_its_events_begin() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    // The cache answers for "now" = 10, but only after it applied 11.
    let r = w.h.put(&["/registry/late"]);
    w.cache.rv = r;
    // Instead of the fake cache's own answer: registered at 10 (after_rev) while at 11.
    w.cache.inbox.clear();
    w.cache.watches.clear();
    let tag = *w.s.by_tag.keys().next().expect("tag");
    w.cache.watches.insert(RequestId(99), (tag, KeyRange::Prefix(Key::from(PREFIX))));
    w.s.handle_cache(
        w.now,
        CacheMsg::Started { tag, watch: RequestId(99), after_rev: 10, cache_rv: r },
    );
    let run =
        Arc::new(EventRun::new(r, w.h.events_in(&KeyRange::Prefix(Key::from(PREFIX)), 10, r)));
    w.s.handle_cache(
        w.now,
        CacheMsg::Events { run, items: vec![WatchItems { tag, picks: Picks::one(0) }] },
    );
    let mut created_rev = None;
    while let Some(o) = w.s.poll_output() {
        if let SessionOutput::Respond(Response::Message(m)) = &o {
            if m.created {
                created_rev = m.header.as_ref().map(|h| h.revision);
            }
        }
        if let SessionOutput::Respond(r) = o {
            w.seen.push(seen(r));
        }
    }
    assert_eq!(created_rev, Some(10), "created where its events begin");
    assert_eq!(World::revs_of(&w.seen, 0), vec![r]);
}

/// What a cached watch is sent of the cache's events: nothing it was given already, nothing
/// below its start, nothing its filters leave out; the cache's own picks when nothing is left
/// out; and its whole share back as credit, with the last response or at once.
#[test]
fn cached_events_are_filtered_and_their_credit_comes_back_whole() {
    let mut w = World::new(World::cfg());
    let mut c = PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    };
    if let Some(PbWatchRequestUnion::CreateRequest(cr)) = c.request_union.as_mut() {
        cr.key = PREFIX.as_bytes().to_vec();
        cr.range_end = b"/registry0".to_vec();
        cr.start_revision = 5;
        cr.filters = vec![1]; // NODELETE
    }
    w.request(c.request_union.expect("set"));
    w.pump();
    let revs: Vec<u64> = (5..=10).collect();
    assert_eq!(
        w.take(),
        vec![Seen::Created { id: 0, canceled: false }, Seen::Events { id: 0, revs }]
    );
    let tag = w.cache.watches.values().next().expect("the cached watch").0;
    let t = Timestamp::ZERO;
    let obj = |rev: u64| Arc::new(Object::new(b"/registry/x", Some(b"v"), rev));
    // Given already (10, the last revision sent), a delete (11), a new put (12): only 12 goes
    // out.
    let run = Arc::new(EventRun::new(
        12,
        vec![
            Arc::new(Event::put(obj(10), None, t)),
            Arc::new(Event::delete(11, obj(10), t)),
            Arc::new(Event::put(obj(12), None, t)),
        ],
    ));
    let deliver = |w: &mut World, run: Arc<EventRun>, picks: Picks| {
        w.s.handle_cache(w.now, CacheMsg::Events { run, items: vec![WatchItems { tag, picks }] });
        let mut out = Vec::new();
        while let Some(o) = w.s.poll_output() {
            match o {
                SessionOutput::Respond(Response::Events(e)) => out.push((
                    seen(Response::Events(e.clone())),
                    e.picks.clone(),
                    e.credit.map(|c| c.n),
                )),
                SessionOutput::Cache { cmd: CacheCmd::Credit { n, .. }, .. } => {
                    out.push((Seen::Progress { id: -9, rev: n }, Picks::Range(0, 0), None))
                }
                o => panic!("unexpected output {o:?}"),
            }
        }
        out
    };
    assert_eq!(
        deliver(&mut w, run, Picks::Range(0, 3)),
        vec![(Seen::Events { id: 0, revs: vec![12] }, Picks::Range(2, 3), Some(3))]
    );
    // Only a delete: nothing to send, the credit at once.
    let run = Arc::new(EventRun::new(13, vec![Arc::new(Event::delete(13, obj(12), t))]));
    assert_eq!(
        deliver(&mut w, run, Picks::Range(0, 1)),
        vec![(Seen::Progress { id: -9, rev: 1 }, Picks::Range(0, 0), None)]
    );
    // Nothing left out: the cache's picks as they came.
    let run = Arc::new(EventRun::new(
        15,
        vec![Arc::new(Event::put(obj(14), None, t)), Arc::new(Event::put(obj(15), None, t))],
    ));
    assert_eq!(
        deliver(&mut w, run, Picks::Range(0, 2)),
        vec![(Seen::Events { id: 0, revs: vec![14, 15] }, Picks::Range(0, 2), Some(2))]
    );
}

/// etcd's `sendFragments`: below the limit or with one event, one response; otherwise pieces
/// that each stay below it (a first event alone may not), all but the last marked.
#[test]
fn fragments_cut_as_etcd_cuts_them() {
    let t = Timestamp::ZERO;
    let put = |rv: u64, len: usize| {
        let v = vec![b'x'; len];
        Arc::new(Event::put(Arc::new(Object::new(b"/k", Some(&v), rv)), None, t))
    };
    let run = EventRun::new(9, vec![put(5, 600), put(6, 600), put(7, 2000), put(8, 600)]);
    let shape = |limit: usize| {
        fragments(&run, Picks::Range(0, 4), false, limit)
            .into_iter()
            .map(|(p, size, more)| (p.iter().collect::<Vec<_>>(), size < limit, more))
            .collect::<Vec<_>>()
    };
    // Everything fits: one response, not a fragment.
    assert_eq!(shape(1 << 20), vec![(vec![0, 1, 2, 3], true, false)]);
    // 1 500 bytes: two small events, then the big one alone (over the limit), then the last.
    assert_eq!(
        shape(1500),
        vec![(vec![0, 1], true, true), (vec![2], false, true), (vec![3], true, false)]
    );
    // One event is never cut.
    let one = fragments(&run, Picks::one(2), false, 100);
    assert_eq!(one.len(), 1);
    assert!(!one[0].2);
}

/// A progress request that waits on a relay's answer, when the relay's watch moves back onto
/// the cache meanwhile (so that answer never comes): the request is still answered. Found by
/// `random_multiplexed_watches_match_etcd` (seed 2): the stream's progress answers stopped
/// for good.
/// Found by `random_slow_readers` (seed 25): etcd answers progress requests with no id, so a
/// relay's answer may be one etcd computed before the client asked (an earlier request's,
/// still on its way). The stream's answer must not be below etcd's revision at the client's
/// request: the caches' fresh frontier sets the floor, a relay's answer below it is asked
/// again. With only relayed watches, a cache is asked for the floor alone.
#[test]
fn a_stale_relay_progress_answer_is_not_taken_for_the_clients_request() {
    for cached_too in [false, true] {
        let mut w = World::new(World::cfg());
        if cached_too {
            w.watch_prefix(0);
        }
        // Outside the cache's prefix: relayed.
        w.create("/other", "", 0, 0);
        w.pump();
        w.take();
        let rev = w.write(&["/registry/x"]);
        w.pump();
        w.take();
        w.etcd.stale_progress = Some(rev - 1);
        w.progress();
        w.pump();
        w.advance(1_000);
        let progress: Vec<_> =
            w.take().into_iter().filter(|s| matches!(s, Seen::Progress { .. })).collect();
        assert_eq!(progress, vec![Seen::Progress { id: -1, rev }], "cached too: {cached_too}");
    }
}

/// Found by `random_slow_readers` (seed 25): a progress request that came while an earlier
/// one's query was out was answered by that query, at the revision of its frontiers, below a
/// write the client had seen acknowledged before it asked. It gets an answer of its own.
#[test]
fn a_progress_request_during_a_query_gets_an_answer_at_least_as_new_as_itself() {
    let mut w = World::new(World::cfg());
    w.watch_prefix(0);
    // Outside the cache's prefix: relayed; etcd holds its progress answers back for now.
    w.create("/other", "", 0, 0);
    w.pump();
    w.take();
    w.etcd.answers_progress = false;
    let before = w.h.rev;
    w.progress();
    w.pump();
    // A write no watch of the stream sees: no event vouches for its revision.
    let rev = w.write(&["/unwatched"]);
    w.pump();
    w.progress();
    w.pump();
    w.etcd.answers_progress = true;
    w.advance(1_000);
    let progress: Vec<u64> = w
        .take()
        .into_iter()
        .filter_map(|s| match s {
            Seen::Progress { rev, .. } => Some(rev),
            _ => None,
        })
        .collect();
    assert!(rev > before);
    assert_eq!(progress.last(), Some(&rev), "the second request's answer: {progress:?}");
}

#[test]
fn progress_is_answered_when_a_relay_it_waits_for_rejoins_the_cache() {
    let mut w = World::new(SessionConfig { rejoin_interval_ms: 100, ..World::cfg() });
    w.cache.oldest = 8;
    w.watch_prefix(3);
    w.pump();
    let seen = w.take();
    assert_eq!(World::revs_of(&seen, 0), (3..=10).collect::<Vec<_>>());
    // etcd holds the relay's progress answer back; the client asks.
    w.etcd.answers_progress = false;
    w.progress();
    w.pump();
    assert!(!w.take().iter().any(|s| matches!(s, Seen::Progress { .. })));
    // The rejoin check moves the watch onto the cache and closes the relay.
    w.advance(150);
    assert!(w.notes.contains(&Note::Rejoined), "{:?}", w.notes);
    w.advance(1_000);
    let seen = w.take();
    assert!(
        seen.iter().any(|s| matches!(s, Seen::Progress { id: -1, rev: 10 })),
        "the progress request is answered: {seen:?}"
    );
}

// ----- fragments of relayed responses ------------------------------------------------------------

/// etcd sends a fragmented response's fragments one after the other (`sendFragments`, called
/// from the stream's one send loop), and clientv3 relies on it: while a response is open it
/// merges the same watch's next responses into it and drops any other. A relay hands etcd's
/// fragments over one by one; a cached watch's events that came meanwhile must not go out
/// between them.
#[test]
fn a_relayed_watchs_fragments_go_out_one_after_the_other() {
    let mut w = World::new(World::cfg());
    // Outside the cache's prefix: relayed (id 0); the prefix: cached (id 1).
    w.create_fragmented("/other/", "/other0", 0);
    w.watch_prefix(0);
    w.pump();
    w.take();
    let rev = w.h.put(&["/other/a", "/other/b", "/other/c", "/registry/x"]);
    w.etcd.catch_up(&w.h);
    w.etcd.inbox.clear();
    w.relay_fragment(rev, "/other/", 0, 1, true);
    w.cache.catch_up(&w.h);
    w.pump();
    w.relay_fragment(rev, "/other/", 1, 2, false);
    w.pump();
    let got = clientv3(&w.wire).expect("clientv3 takes every response");
    assert_eq!(got.get(&0), Some(&vec![rev, rev, rev]));
    assert_eq!(got.get(&1), Some(&vec![rev]));
}

/// A relayed watch's source may change between the fragments of a response: its relay ends
/// (etcd restarts) or it moves back onto the cache. The client holds the fragments that went
/// out as the start of one response; what the next source sends must not repeat them.
#[test]
fn a_fragmented_response_cut_by_a_change_of_source_is_not_repeated() {
    for rejoin in [false, true] {
        let mut w = World::new(SessionConfig { rejoin_interval_ms: 100, ..World::cfg() });
        let prefix = if rejoin { PREFIX } else { "/other/" };
        if rejoin {
            // Below the cache's window: relayed until it has caught up.
            w.cache.oldest = 8;
            w.create_fragmented(PREFIX, "/registry0", 3);
        } else {
            w.create_fragmented("/other/", "/other0", 0);
        }
        w.pump();
        let rev = w.h.put(&[&format!("{prefix}a"), &format!("{prefix}b"), &format!("{prefix}c")]);
        w.etcd.catch_up(&w.h);
        w.etcd.inbox.clear();
        w.cache.catch_up(&w.h);
        w.pump();
        w.relay_fragment(rev, prefix, 0, 1, true);
        if rejoin {
            w.advance(150);
            assert!(w.notes.contains(&Note::Rejoined), "{:?}", w.notes);
        } else {
            w.etcd.go_down();
            w.pump();
            w.etcd.up = true;
            w.advance(3_000);
        }
        let got = clientv3(&w.wire).expect("clientv3 takes every response");
        let revs: Vec<u64> = got[&0].iter().copied().filter(|r| *r == rev).collect();
        assert_eq!(revs, vec![rev, rev, rev], "rejoin: {rejoin}, {:?}", w.wire);
    }
}

// ----- a relay that pauses ----------------------------------------------------------------------

/// A relay on a connection that other calls share stops reading etcd when the session is
/// behind (its unread responses would otherwise fill the connection's HTTP/2 window and stall
/// every call on it): its etcd watch ends, and what etcd had sent past the responses handed
/// over is gone with it. The session takes the watch up at once after the last revision it
/// delivered: every revision once, no second `created`, no backoff.
#[test]
fn a_paused_relay_is_taken_up_after_the_last_revision_delivered() {
    let mut w = World::new(World::cfg());
    // Nothing from the cache: etcd serves the watch throughout.
    w.cache.oldest = 100;
    w.watch_prefix(2);
    while let Some(m) = w.cache.inbox.pop_front() {
        w.s.handle_cache(w.now, m);
        w.outputs();
    }
    // etcd answered the create and sent revisions 2..=10; the session takes the created and
    // three revisions, then the relay pauses.
    let first: Vec<(RelayId, RelayEvent)> = w.etcd.inbox.drain(..).collect();
    assert_eq!(first.len(), 10, "created and revisions 2..=10");
    let relay = first[0].0;
    for (r, ev) in first.into_iter().take(4) {
        w.s.handle_relay(w.now, r, ev);
        w.outputs();
    }
    w.etcd.relays.remove(&relay);
    w.s.handle_relay(w.now, relay, RelayEvent::Paused);
    w.pump();
    let seen = w.take();
    assert_eq!(World::revs_of(&seen, 0), (2..=10).collect::<Vec<u64>>(), "{seen:?}");
    assert_eq!(w.etcd.opened, 2, "one more watch on etcd");
    // Later revisions come once, from the new relay.
    let a = w.write(&["/registry/x"]);
    let b = w.write(&["/registry/y"]);
    w.pump();
    let later = w.take();
    assert_eq!(World::revs_of(&later, 0), vec![a, b]);
    let created = seen.iter().chain(&later).filter(|s| matches!(s, Seen::Created { .. })).count();
    assert_eq!(created, 1, "one created: {seen:?}");
}
