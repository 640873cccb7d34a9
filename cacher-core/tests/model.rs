//! Property tests: random sequences of storage events, relists, watches (with random RVs,
//! selectors, slow consumers), lists, gets and time jumps, checked after every step against a
//! simple reference model of storage:
//!
//! - every watch's change events are exactly a prefix of the matching storage history after
//!   its start RV: ordered, unique, gap-free (with ADDED/DELETED on selector transitions);
//! - initial events are the model's state at the start RV (a prefix of it if the watch ended);
//! - a bookmark at B comes only after every matching event up to B, and never below the start;
//! - every watch ends exactly once (CLOSED, or REJECTED / sent to storage) and nothing follows;
//! - a watch that reads everything has, at the end, every event up to the cache's RV;
//! - lists and gets from the cache equal the model's state at the RV they report;
//! - the core's internal invariants hold after every step.

use std::collections::BTreeMap;

use cacher_core::{
    Attrs, Cacher, Change, ChangeKind, Config, ConsumeMode, GetRequest, InitialSource, Key,
    KeyRange, LabelSelector, ListRequest, Object, Output, Profile, ReadOutcome, RequestId, RvMatch,
    RvParam, SlowPolicy, Timestamp, WatchEvent, WatchRequest,
};
use proptest::prelude::*;

#[derive(Clone, Debug, PartialEq)]
struct Obj {
    value: String,
    web: bool,
    node: u8,
    rv: u64,
}

#[derive(Clone, Debug)]
struct Hist {
    rv: u64,
    key: String,
    prev: Option<Obj>,
    cur: Option<Obj>,
}

#[derive(Clone, Copy, Debug)]
enum RangeChoice {
    All,
    PathPrefix,
    One,
    Bytes,
}

impl RangeChoice {
    fn range(self) -> KeyRange {
        match self {
            RangeChoice::All => KeyRange::Prefix(Key::from("/pods/")),
            RangeChoice::PathPrefix => KeyRange::Prefix(Key::from("/pods/ns")),
            RangeChoice::One => KeyRange::Exact(Key::from("/pods/ns/k1")),
            RangeChoice::Bytes => KeyRange::Range {
                start: Key::from("/pods/ns/k1"),
                end: Some(Key::from("/pods/ns/k4")),
            },
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum RvChoice {
    Unset,
    Zero,
    Back(u8),
    Ahead(u8),
}

impl RvChoice {
    fn param(self, current: u64) -> RvParam {
        match self {
            RvChoice::Unset => RvParam::Unset,
            RvChoice::Zero => RvParam::Zero,
            RvChoice::Back(n) => RvParam::At(current.saturating_sub(u64::from(n)).max(1)),
            RvChoice::Ahead(n) => RvParam::At(current + u64::from(n)),
        }
    }
}

#[derive(Clone, Debug)]
struct WatchSpec {
    range: RangeChoice,
    rv: RvChoice,
    sie: Option<bool>,
    bookmarks: bool,
    manual: bool,
    lag: bool,
    web_only: bool,
    node_pinned: Option<u8>,
    timeout_ms: Option<u16>,
    queue: Option<u8>,
}

#[derive(Clone, Debug)]
struct ListSpec {
    range: RangeChoice,
    rv: RvChoice,
    limit: u8,
    exact: bool,
    web_only: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Put { keys: Vec<u8>, web: bool, node: u8 },
    Delete { key: u8 },
    Progress { bump: u8 },
    Fail,
    Relist { bump: u8 },
    Watch(WatchSpec),
    Consume { w: u8, max: Option<u8> },
    Credit { w: u8, n: u8 },
    Stop { w: u8 },
    List(ListSpec),
    Get { key: u8, rv: RvChoice },
    Range { range: RangeChoice, back: Option<u8>, linearizable: bool, limit: u8 },
    Advance { ms: u16 },
    Compact,
}

fn rv_choice() -> impl Strategy<Value = RvChoice> {
    prop_oneof![
        1 => Just(RvChoice::Unset),
        2 => Just(RvChoice::Zero),
        4 => (0u8..6).prop_map(RvChoice::Back),
        1 => (1u8..3).prop_map(RvChoice::Ahead),
    ]
}

fn range_choice() -> impl Strategy<Value = RangeChoice> {
    prop_oneof![
        4 => Just(RangeChoice::All),
        1 => Just(RangeChoice::PathPrefix),
        1 => Just(RangeChoice::One),
        1 => Just(RangeChoice::Bytes),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let watch = (
        range_choice(),
        rv_choice(),
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![3 => Just(None), 1 => (0u8..3).prop_map(Some)],
        prop_oneof![3 => Just(None), 1 => (0u16..5000).prop_map(Some)],
        prop_oneof![2 => Just(None), 1 => (1u8..4).prop_map(Some)],
    )
        .prop_map(
            |(range, rv, sie, bookmarks, manual, lag, web_only, node_pinned, timeout_ms, queue)| {
                Op::Watch(WatchSpec {
                    range,
                    rv,
                    sie,
                    bookmarks,
                    manual,
                    lag,
                    web_only,
                    node_pinned,
                    timeout_ms,
                    queue,
                })
            },
        );
    let list = (range_choice(), rv_choice(), 0u8..4, any::<bool>(), any::<bool>()).prop_map(
        |(range, rv, limit, exact, web_only)| {
            Op::List(ListSpec { range, rv, limit, exact, web_only })
        },
    );
    prop_oneof![
        10 => (prop::collection::vec(0u8..6, 1..3), any::<bool>(), 0u8..3)
            .prop_map(|(keys, web, node)| Op::Put { keys, web, node }),
        3 => (0u8..6).prop_map(|key| Op::Delete { key }),
        2 => (0u8..3).prop_map(|bump| Op::Progress { bump }),
        1 => Just(Op::Fail),
        1 => (0u8..3).prop_map(|bump| Op::Relist { bump }),
        6 => watch,
        4 => (any::<u8>(), prop::option::of(1u8..8)).prop_map(|(w, max)| Op::Consume { w, max }),
        1 => (any::<u8>(), 0u8..6).prop_map(|(w, n)| Op::Credit { w, n }),
        2 => any::<u8>().prop_map(|w| Op::Stop { w }),
        3 => list,
        2 => (0u8..6, rv_choice()).prop_map(|(key, rv)| Op::Get { key, rv }),
        2 => (range_choice(), prop::option::of(0u8..6), any::<bool>(), 0u8..4)
            .prop_map(|(range, back, linearizable, limit)| Op::Range { range, back, linearizable, limit }),
        4 => (0u16..4000).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Compact),
    ]
}

/// What a client saw on one watch.
#[derive(Debug, Clone)]
enum Seen {
    Started(u64, InitialSource),
    Initial(String, u64),
    Change(ChangeKind, String, u64),
    Bookmark(u64, bool),
    Error(u16),
    Closed,
    Rejected,
    Delegated,
}

struct WatchRec {
    spec: WatchSpec,
    seen: Vec<Seen>,
}

struct Harness {
    c: Cacher,
    now: u64,
    rv: u64,
    state: BTreeMap<String, Obj>,
    states: Vec<(u64, BTreeMap<String, Obj>)>,
    history: Vec<Hist>,
    cache_up: bool,
    watches: Vec<(RequestId, WatchRec)>,
    by_id: BTreeMap<RequestId, usize>,
    lists: BTreeMap<RequestId, (ListSpec, RvParam, u64)>,
    gets: BTreeMap<RequestId, (String, RvParam)>,
    ranges: BTreeMap<RequestId, (RangeChoice, u64, bool, u64, u64)>,
}

fn key(k: u8) -> String {
    format!("/pods/ns/k{k}")
}

fn to_object(k: &str, o: &Obj) -> Object {
    let labels: Vec<(&str, &str)> = if o.web { vec![("app", "web")] } else { vec![] };
    let node = format!("n{}", o.node);
    Object::new(k.as_bytes(), Some(o.value.as_bytes()), o.rv).with_attrs(Attrs::new(
        labels,
        [("metadata.namespace", "ns"), ("spec.nodeName", node.as_str())],
    ))
}

fn selects(range: &KeyRange, web_only: bool, node: Option<u8>, k: &str, o: &Obj) -> bool {
    range.contains(k.as_bytes()) && (!web_only || o.web) && node.is_none_or(|n| o.node == n)
}

impl Harness {
    fn new(profile: Profile, capacity: usize, seed: u64) -> Harness {
        let mut cfg = Config::for_profile(profile);
        cfg.capacity = capacity;
        cfg.lower_bound_capacity = capacity.min(4);
        cfg.upper_bound_capacity = 16;
        cfg.bookmark_frequency_ms = 1500;
        cfg.index_field = Some("spec.nodeName".into());
        cfg.watch_list = true;
        cfg.seed = seed;
        let c = Cacher::new(cfg, Timestamp::ZERO).expect("config");
        let mut h = Harness {
            c,
            now: 0,
            rv: 1,
            state: BTreeMap::new(),
            states: Vec::new(),
            history: Vec::new(),
            cache_up: false,
            watches: Vec::new(),
            by_id: BTreeMap::new(),
            lists: BTreeMap::new(),
            gets: BTreeMap::new(),
            ranges: BTreeMap::new(),
        };
        for k in 0..3u8 {
            h.state
                .insert(key(k), Obj { value: format!("init{k}"), web: k % 2 == 0, node: k, rv: 1 });
        }
        h.states.push((1, h.state.clone()));
        h.relist(0);
        h
    }

    fn t(&self) -> Timestamp {
        Timestamp::from_millis(self.now)
    }

    fn state_at(&self, rv: u64) -> BTreeMap<String, Obj> {
        let i = self.states.partition_point(|(r, _)| *r <= rv);
        self.states[i.saturating_sub(1)].1.clone()
    }

    fn relist(&mut self, bump: u8) {
        self.rv += u64::from(bump);
        let objs: Vec<Object> = self.state.iter().map(|(k, o)| to_object(k, o)).collect();
        self.c.handle_replace(self.t(), self.rv, objs).expect("replace");
        self.cache_up = true;
        self.states.push((self.rv, self.state.clone()));
    }

    fn apply(&mut self, op: &Op) {
        self.now += 7;
        let t = self.t();
        match op {
            Op::Put { keys, web, node } => {
                self.rv += 1;
                let mut keys = keys.clone();
                keys.sort_unstable();
                keys.dedup();
                let mut changes = Vec::new();
                for &k in &keys {
                    let k = key(k);
                    let o =
                        Obj { value: format!("v{}", self.rv), web: *web, node: *node, rv: self.rv };
                    let prev = self.state.insert(k.clone(), o.clone());
                    self.history.push(Hist {
                        rv: self.rv,
                        key: k.clone(),
                        prev,
                        cur: Some(o.clone()),
                    });
                    changes.push(Change::Put(to_object(&k, &o)));
                }
                if self.cache_up {
                    self.c.handle_revision(t, self.rv, changes).expect("revision");
                }
                self.states.push((self.rv, self.state.clone()));
            }
            Op::Delete { key: k } => {
                let k = key(*k);
                if let Some(prev) = self.state.remove(&k) {
                    self.rv += 1;
                    self.history.push(Hist {
                        rv: self.rv,
                        key: k.clone(),
                        prev: Some(prev),
                        cur: None,
                    });
                    if self.cache_up {
                        self.c.handle_delete(t, k.as_bytes(), self.rv).expect("delete");
                    }
                    self.states.push((self.rv, self.state.clone()));
                }
            }
            Op::Progress { bump } => {
                self.rv += u64::from(*bump);
                self.states.push((self.rv, self.state.clone()));
                if self.cache_up {
                    self.c.handle_progress(t, self.rv).expect("progress");
                }
            }
            Op::Fail => {
                self.c.handle_storage_error(t, "test failure");
                self.cache_up = false;
            }
            Op::Relist { bump } => {
                self.c.handle_storage_error(t, "test relist");
                self.relist(*bump);
            }
            Op::Watch(spec) => {
                let mut req = WatchRequest::new(spec.range.range(), spec.rv.param(self.rv));
                req.send_initial_events = spec.sie;
                req.allow_bookmarks = spec.bookmarks;
                req.consume = if spec.manual { ConsumeMode::Manual } else { ConsumeMode::Auto };
                req.slow_policy = if spec.lag { SlowPolicy::Lag } else { SlowPolicy::Terminate };
                req.timeout_ms = spec.timeout_ms.map(u64::from);
                req.queue_capacity = spec.queue.map(usize::from);
                if spec.web_only {
                    req.selector.labels = LabelSelector::parse("app=web").unwrap();
                }
                if let Some(n) = spec.node_pinned {
                    req.selector.fields =
                        cacher_core::FieldSelector::parse(&format!("spec.nodeName=n{n}")).unwrap();
                }
                let id = self.c.start_watch(t, req).expect("valid watch");
                self.by_id.insert(id, self.watches.len());
                self.watches.push((id, WatchRec { spec: spec.clone(), seen: Vec::new() }));
            }
            Op::Consume { w, max } => {
                if let Some(id) = self.pick(*w) {
                    self.c.consume(t, id, max.map(u64::from));
                }
            }
            Op::Credit { w, n } => {
                if let Some(id) = self.pick(*w) {
                    self.c.grant_credit(t, id, u64::from(*n));
                }
            }
            Op::Stop { w } => {
                if let Some(id) = self.pick(*w) {
                    self.c.stop_watch(t, id);
                }
            }
            Op::List(spec) => {
                let mut req = ListRequest::new(spec.range.range(), spec.rv.param(self.rv));
                req.limit = u64::from(spec.limit);
                if spec.exact && matches!(req.rv, RvParam::At(_)) {
                    req.rv_match = Some(RvMatch::Exact);
                }
                if spec.web_only {
                    req.selector.labels = LabelSelector::parse("app=web").unwrap();
                }
                let param = req.rv;
                let exact = req.rv_match == Some(RvMatch::Exact);
                if let Ok(id) = self.c.list(t, req) {
                    let mut spec = spec.clone();
                    spec.exact = exact;
                    self.lists.insert(id, (spec, param, self.rv));
                }
            }
            Op::Get { key: k, rv } => {
                let req = GetRequest { key: Key::from(key(*k).as_str()), rv: rv.param(self.rv) };
                let param = req.rv;
                if let Ok(id) = self.c.get(t, req) {
                    self.gets.insert(id, (key(*k), param));
                }
            }
            Op::Range { range, back, linearizable, limit } => {
                let revision = back.map_or(0, |b| self.rv.saturating_sub(u64::from(b)).max(1));
                let req = cacher_core::RangeRequest {
                    range: range.range(),
                    revision,
                    linearizable: *linearizable,
                    limit: u64::from(*limit),
                };
                let id = self.c.range(t, req).expect("valid range");
                self.ranges
                    .insert(id, (*range, revision, *linearizable, u64::from(*limit), self.rv));
            }
            Op::Advance { ms } => {
                let target = self.now + u64::from(*ms);
                while let Some((due, _)) = self.c.poll_timeout() {
                    if due.as_millis() > target {
                        break;
                    }
                    self.now = self.now.max(due.as_millis());
                    self.c.handle_timeout(due);
                    self.drain();
                    self.c.check_invariants();
                }
                self.now = target;
            }
            Op::Compact => {
                self.c.handle_compaction(t, self.rv.saturating_sub(2));
            }
        }
        self.drain();
        self.c.check_invariants();
    }

    fn pick(&self, w: u8) -> Option<RequestId> {
        if self.watches.is_empty() {
            return None;
        }
        Some(self.watches[w as usize % self.watches.len()].0)
    }

    fn record(&mut self, id: RequestId, s: Seen) {
        if let Some(&i) = self.by_id.get(&id) {
            self.watches[i].1.seen.push(s);
        }
    }

    fn drain(&mut self) {
        while let Some(out) = self.c.poll_output() {
            match out {
                Output::WatchStarted { watch, rv, initial } => {
                    self.record(watch, Seen::Started(rv, initial))
                }
                Output::Fanout { event, targets } => {
                    for &cacher_core::Target { watch: id, kind } in targets.iter() {
                        let e = WatchEvent::Change(kind, event.clone());
                        self.record(id, seen_of(&e));
                    }
                }
                Output::Deliver { watch, events } => {
                    for e in &events {
                        self.record(watch, seen_of(e));
                    }
                }
                Output::WatchError { watch, status } => {
                    self.record(watch, Seen::Error(status.code()))
                }
                Output::WatchClosed { watch, .. } => self.record(watch, Seen::Closed),
                Output::WatchDelegated { watch, .. } => self.record(watch, Seen::Delegated),
                Output::Rejected { request, .. } => self.record(request, Seen::Rejected),
                Output::List { request, outcome } => self.check_list(request, &outcome),
                Output::Get { request, outcome } => self.check_get(request, &outcome),
                Output::Range { request, outcome } => self.check_range(request, &outcome),
                Output::NeedCurrentRevision { request } => {
                    let t = self.t();
                    self.c.handle_current_revision(t, request, self.rv);
                }
                Output::RequestProgress | Output::Relist { .. } => {}
            }
        }
    }

    fn check_list(&mut self, id: RequestId, outcome: &ReadOutcome) {
        let Some((spec, param, storage_rv_then)) = self.lists.remove(&id) else { return };
        let ReadOutcome::Cache(read) = outcome else { return };
        assert!(read.rv <= self.rv, "list at {} beyond storage's revision {}", read.rv, self.rv);
        match param {
            RvParam::At(n) if spec.exact => assert_eq!(read.rv, n, "exact list"),
            RvParam::At(n) => assert!(read.rv >= n, "list at {} older than requested {n}", read.rv),
            RvParam::Unset => assert!(
                read.rv >= storage_rv_then,
                "consistent list at {} older than storage's {storage_rv_then} when asked",
                read.rv
            ),
            RvParam::Zero => {}
        }
        let mut range = spec.range.range();
        if self.c.config().profile == Profile::V1_34 {
            // 1.31+: recursive list keys get a trailing '/'.
            if let RangeChoice::PathPrefix = spec.range {
                range = KeyRange::Prefix(Key::from("/pods/ns/"));
            }
        }
        let want: Vec<(String, u64)> = self
            .state_at(read.rv)
            .iter()
            .filter(|(k, o)| selects(&range, spec.web_only, None, k, o))
            .map(|(k, o)| (k.clone(), o.rv))
            .collect();
        let got: Vec<(String, u64)> = read
            .items
            .iter()
            .map(|o| (String::from_utf8(o.key().to_vec()).unwrap(), o.rv()))
            .collect();
        if read.continue_token.is_some() {
            assert!(
                got.len() <= want.len() && got[..] == want[..got.len()],
                "list page at {}: got {got:?}, want a prefix of {want:?}",
                read.rv
            );
        } else {
            assert_eq!(got, want, "list at rv {} ({spec:?})", read.rv);
        }
        for o in &read.items {
            let k = String::from_utf8(o.key().to_vec()).unwrap();
            let model = &self.state_at(read.rv)[&k];
            assert_eq!(o.value(), Some(model.value.as_bytes()));
        }
    }

    fn check_get(&mut self, id: RequestId, outcome: &ReadOutcome) {
        let Some((k, param)) = self.gets.remove(&id) else { return };
        let ReadOutcome::Cache(read) = outcome else { return };
        assert!(
            read.rv <= self.rv && read.rv >= param.value(),
            "get at {} (asked {param})",
            read.rv
        );
        let want = self.state_at(read.rv).get(&k).map(|o| o.rv);
        assert_eq!(read.items.first().map(|o| o.rv()), want, "get {k} at {}", read.rv);
    }

    fn check_range(&mut self, id: RequestId, outcome: &cacher_core::RangeOutcome) {
        let Some((choice, revision, linearizable, limit, storage_rv_then)) =
            self.ranges.remove(&id)
        else {
            return;
        };
        let cacher_core::RangeOutcome::Cache(read) = outcome else { return };
        let at = if revision > 0 { revision } else { read.header_rv };
        assert!(
            read.header_rv <= self.rv,
            "range header {} beyond storage {}",
            read.header_rv,
            self.rv
        );
        if linearizable {
            assert!(
                read.header_rv >= storage_rv_then,
                "linearizable range at {} older than {storage_rv_then}",
                read.header_rv
            );
        }
        let range = choice.range();
        let want: Vec<(String, u64)> = self
            .state_at(at)
            .iter()
            .filter(|(k, _)| range.contains(k.as_bytes()))
            .map(|(k, o)| (k.clone(), o.rv))
            .collect();
        let got: Vec<(String, u64)> = read
            .items
            .iter()
            .map(|o| (String::from_utf8(o.key().to_vec()).unwrap(), o.rv()))
            .collect();
        let n = if limit == 0 { want.len() } else { want.len().min(limit as usize) };
        assert_eq!(got, want[..n].to_vec(), "range at {at} ({choice:?}, limit {limit})");
        assert_eq!(read.count, want.len() as u64, "range count at {at}");
        assert_eq!(read.more, n < want.len(), "range more at {at}");
    }

    /// The matching storage history after `from` as a watch with this spec sees it.
    fn expected_changes(&self, spec: &WatchSpec, from: u64) -> Vec<(ChangeKind, String, u64)> {
        let range = spec.range.range();
        self.history
            .iter()
            .filter(|h| h.rv > from)
            .filter_map(|h| {
                let sel = |o: &Option<Obj>| {
                    o.as_ref().is_some_and(|o| {
                        selects(&range, spec.web_only, spec.node_pinned, &h.key, o)
                    })
                };
                let kind = match (sel(&h.cur), sel(&h.prev)) {
                    (true, false) => ChangeKind::Added,
                    (true, true) => ChangeKind::Modified,
                    (false, true) => ChangeKind::Deleted,
                    (false, false) => return None,
                };
                Some((kind, h.key.clone(), h.rv))
            })
            .collect()
    }

    fn check_watches(&self, final_check: bool) {
        for (id, rec) in &self.watches {
            let seen = &rec.seen;
            let terminal = seen
                .iter()
                .position(|s| matches!(s, Seen::Closed | Seen::Rejected | Seen::Delegated));
            if let Some(p) = terminal {
                assert_eq!(p + 1, seen.len(), "{id}: something after the end: {seen:?}");
            }
            for (i, s) in seen.iter().enumerate() {
                if matches!(s, Seen::Error(_)) {
                    assert!(
                        matches!(seen.get(i + 1), Some(Seen::Closed) | None),
                        "{id}: ERROR not followed by the end: {seen:?}"
                    );
                }
            }
            if final_check {
                assert!(terminal.is_some(), "{id}: never ended: {seen:?}");
            }
            let Some(Seen::Started(from, source)) = seen.first().cloned() else {
                assert!(
                    seen.iter().all(|s| matches!(
                        s,
                        Seen::Closed | Seen::Rejected | Seen::Delegated | Seen::Error(_)
                    )),
                    "{id}: events before start: {seen:?}"
                );
                continue;
            };
            let range = rec.spec.range.range();
            // Initial events: the state at `from`, in key order (a prefix if the watch ended).
            let initial: Vec<(String, u64)> = seen
                .iter()
                .filter_map(|s| match s {
                    Seen::Initial(k, rv) => Some((k.clone(), *rv)),
                    _ => None,
                })
                .collect();
            if source == InitialSource::Store {
                let want: Vec<(String, u64)> = self
                    .state_at(from)
                    .iter()
                    .filter(|(k, o)| selects(&range, rec.spec.web_only, rec.spec.node_pinned, k, o))
                    .map(|(k, o)| (k.clone(), o.rv))
                    .collect();
                assert!(
                    initial.len() <= want.len() && initial[..] == want[..initial.len()],
                    "{id}: initial {initial:?} not a prefix of state at {from} {want:?}"
                );
            } else {
                assert!(initial.is_empty(), "{id}: initial events from {source:?}");
            }
            let expected = self.expected_changes(&rec.spec, from);
            let mut changes = 0;
            let mut last_change_rv = 0;
            let mut end_markers = 0;
            // 1.30 filters a watch from RV 0 without initial events by RV 0 (`processInterval`
            // gets the required RV, 0), so events the cache took before the watch started but
            // dispatch had not reached yet (held up by a blocked watcher) still reach it.
            let stale_ok = self.c.config().profile == Profile::V1_30
                && matches!(rec.spec.rv, RvChoice::Zero)
                && rec.spec.sie == Some(false);
            for s in seen.iter().skip(1) {
                if let (true, Seen::Change(_, _, rv)) = (stale_ok, s) {
                    if *rv <= from && changes == 0 {
                        continue;
                    }
                }
                match s {
                    Seen::Initial(..) => {
                        assert_eq!(changes, 0, "{id}: initial event after a change: {seen:?}")
                    }
                    Seen::Change(kind, k, rv) => {
                        let want = expected.get(changes);
                        assert_eq!(
                            Some(&(*kind, k.clone(), *rv)),
                            want,
                            "{id} (from {from}, {:?}): change #{changes} differs; seen {seen:?}\nexpected {expected:?}",
                            rec.spec
                        );
                        changes += 1;
                        last_change_rv = *rv;
                    }
                    Seen::Bookmark(b, end) => {
                        // 1.30 filters bookmarks by the required RV (0 for RV=0 watches) and its
                        // dispatcher keeps its last RV across a relist, so a bookmark there can be
                        // older than the watch's start; 1.34 raises the filter to the interval's RV.
                        if self.c.config().profile == Profile::V1_34 {
                            assert!(*b >= from, "{id}: bookmark {b} below start {from}");
                        }
                        assert!(
                            *b >= last_change_rv,
                            "{id}: bookmark {b} below delivered {last_change_rv}: {seen:?}"
                        );
                        let owed = expected.iter().filter(|(_, _, rv)| rv <= b).count();
                        assert_eq!(
                            changes, owed,
                            "{id}: bookmark {b} before all events up to it: {seen:?}"
                        );
                        if *end {
                            end_markers += 1;
                        }
                    }
                    Seen::Started(..) => panic!("{id}: started twice"),
                    Seen::Error(code) => {
                        assert!([410, 500, 504].contains(code), "{id}: error {code}")
                    }
                    Seen::Closed | Seen::Rejected | Seen::Delegated => {}
                }
            }
            assert!(end_markers <= 1, "{id}: {end_markers} initial-events-end bookmarks");
            // Liveness: an open watch that reads everything has all events up to what the
            // dispatcher has reached (the cache RV, unless a blocked watcher or the 1.31+
            // dispatcher's start holds dispatch up; a replay from the ring may be further on).
            let open = terminal.is_none();
            let reads_all = !rec.spec.manual;
            if open && reads_all && !final_check {
                let cache_rv = self.c.resource_version();
                let dispatched = cache_rv.min(self.c.last_processed_rv());
                let due = expected.iter().filter(|(_, _, rv)| *rv <= dispatched).count();
                let cached = expected.iter().filter(|(_, _, rv)| *rv <= cache_rv).count();
                assert!(
                    (due..=cached).contains(&changes),
                    "{id}: an auto watch is missing events ({changes} of {due}..={cached}): \
                     {seen:?}\nexpected {expected:?}"
                );
            }
        }
    }

    fn finish(&mut self) {
        self.check_watches(false);
        let ids: Vec<RequestId> = self.watches.iter().map(|(id, _)| *id).collect();
        let t = self.t();
        for id in ids {
            self.c.stop_watch(t, id);
        }
        self.drain();
        self.c.check_invariants();
        self.check_watches(true);
        assert_eq!(self.c.watcher_count(), 0, "watchers left after stopping all");
    }
}

fn seen_of(e: &WatchEvent) -> Seen {
    match e {
        WatchEvent::Initial(o) => {
            Seen::Initial(String::from_utf8(o.key().to_vec()).unwrap(), o.rv())
        }
        WatchEvent::Change(kind, ev) => {
            let obj = e.object().expect("change has an object");
            Seen::Change(*kind, String::from_utf8(obj.key().to_vec()).unwrap(), ev.rv())
        }
        WatchEvent::Bookmark { rv, initial_events_end } => Seen::Bookmark(*rv, *initial_events_end),
    }
}

fn run(profile: Profile, capacity: usize, seed: u64, ops: &[Op]) {
    let mut h = Harness::new(profile, capacity, seed);
    for op in ops {
        h.apply(op);
        h.check_watches(false);
    }
    h.apply(&Op::Advance { ms: 3500 });
    h.finish();
}

proptest! {
    // PROPTEST_CASES=N for a longer hunt (CI runs 512 per profile).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn v1_30_matches_the_model(cap in 1usize..8, seed in any::<u64>(), ops in prop::collection::vec(op(), 1..80)) {
        run(Profile::V1_30, cap, seed, &ops);
    }

    #[test]
    fn v1_34_matches_the_model(cap in 1usize..8, seed in any::<u64>(), ops in prop::collection::vec(op(), 1..80)) {
        run(Profile::V1_34, cap, seed, &ops);
    }
}
