//! Entry points shared by the fuzz targets (`fuzz/`) and the tests that replay committed
//! crashers (`tests/fuzz_regressions.rs`). Each must never panic, whatever the bytes.
//!
//! Kubernetes counterpart: none (the cacher has no fuzz targets; its tests are tables).

use alloc::string::String;
use alloc::vec::Vec;

use crate::config::{Config, Profile};
use crate::key::{Key, KeyRange};
use crate::object::{Attrs, Object};
use crate::request::{ConsumeMode, GetRequest, ListRequest, RvMatch, SlowPolicy, WatchRequest};
use crate::rv::RvParam;
use crate::selector::{FieldSelector, LabelSelector};
use crate::time::Timestamp;
use crate::{Cacher, RequestId};

/// Scenario text through the parser and the replayer.
#[cfg(feature = "serde")]
pub fn scenario(data: &[u8]) {
    if let Ok(text) = core::str::from_utf8(data) {
        let _ = crate::replay::replay_str(text);
    }
}

/// Selector text through both parsers, and a match against an object.
pub fn selector(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let obj = Object::new(b"/k", None, 1).with_attrs(Attrs::new(
        [("app", "web"), ("n", "5"), ("a.b/c", "")],
        [("metadata.namespace", "ns"), ("spec.nodeName", "n1")],
    ));
    if let Ok(s) = LabelSelector::parse(&text) {
        let _ = s.matches(&obj);
        for r in s.requirements() {
            let _ = s.requires_exact_match(r.key());
        }
    }
    if let Ok(s) = FieldSelector::parse(&text) {
        let _ = s.matches(&obj);
    }
}

/// A byte-driven sequence of storage events, client requests and time jumps against one
/// cacher, checking its invariants after every step.
pub fn ops(data: &[u8]) {
    let mut bytes = Bytes(data);
    let profile = if bytes.bit() { Profile::V1_34 } else { Profile::V1_30 };
    let mut cfg = Config::for_profile(profile);
    cfg.capacity = 1 + bytes.byte() as usize % 8;
    cfg.lower_bound_capacity = 1 + bytes.byte() as usize % 4;
    cfg.upper_bound_capacity = cfg.lower_bound_capacity + bytes.byte() as usize % 32;
    cfg.dynamic_capacity = bytes.bit();
    cfg.event_fresh_ms = 1 + u64::from(bytes.byte()) * 50;
    cfg.bookmark_frequency_ms = 1 + u64::from(bytes.byte()) * 20;
    cfg.watch_chan_size = Some(1 + bytes.byte() as usize % 4);
    cfg.seed = u64::from(bytes.byte());
    if bytes.bit() {
        cfg.index_field = Some("spec.nodeName".into());
    }
    cfg.watch_list = bytes.bit() || cfg.watch_list;
    cfg.non_blocking_dispatch = bytes.bit();
    if cfg.profile == Profile::V1_34 && bytes.bit() {
        // v1.37 presets the same gates; its own changes: key checks, dates from storage.
        cfg.profile = Profile::V1_37;
        cfg.resource_prefix = bytes.bit().then(|| "/pods".into());
    }
    let Ok(mut c) = Cacher::new(cfg, Timestamp::ZERO) else { return };
    let mut now = 0u64;
    let mut rv = 0u64;
    let mut watches: Vec<RequestId> = Vec::new();
    while !bytes.is_empty() {
        now += u64::from(bytes.byte()) * u64::from(bytes.byte() % 8);
        let t = Timestamp::from_millis(now);
        match bytes.byte() % 16 {
            0 => {
                rv += u64::from(bytes.byte() % 3);
                let n = bytes.byte() % 4;
                let objs =
                    (0..n).map(|i| object(&mut bytes, i, rv.min(u64::from(i) + 1))).collect();
                let _ = c.handle_replace(t, rv, objs);
            }
            1..=4 => {
                rv += u64::from(bytes.byte() % 3);
                let i = bytes.peek() % 6;
                let o = object(&mut bytes, i, rv);
                let _ = c.handle_put(t, o);
            }
            5 => {
                rv += 1;
                let k = alloc::format!("/pods/ns/{}", bytes.byte() % 6);
                let _ = c.handle_delete(t, k.as_bytes(), rv);
            }
            6 => {
                rv += u64::from(bytes.byte() % 3);
                let _ = c.handle_progress(t, rv);
            }
            7 => c.handle_storage_error(t, "fuzz"),
            8 | 9 => {
                let mut req = WatchRequest::new(range(&mut bytes), rv_param(&mut bytes, rv));
                req.send_initial_events = match bytes.byte() % 3 {
                    0 => None,
                    1 => Some(true),
                    _ => Some(false),
                };
                req.allow_bookmarks = bytes.bit();
                req.consume = if bytes.bit() { ConsumeMode::Manual } else { ConsumeMode::Auto };
                req.slow_policy = if bytes.bit() { SlowPolicy::Lag } else { SlowPolicy::Terminate };
                if bytes.bit() {
                    req.timeout_ms = Some(u64::from(bytes.byte()) * 10);
                }
                if bytes.bit() {
                    req.selector.labels = LabelSelector::parse("app=web").unwrap_or_default();
                }
                if let Ok(id) = c.start_watch(t, req) {
                    watches.push(id);
                }
            }
            10 => {
                if let Some(&id) = pick(&mut bytes, &watches) {
                    let max = bytes.byte();
                    let _ = c.consume(t, id, (max != 0).then_some(u64::from(max)));
                }
            }
            11 => {
                if let Some(&id) = pick(&mut bytes, &watches) {
                    c.stop_watch(t, id);
                }
            }
            12 => {
                let mut req = ListRequest::new(range(&mut bytes), rv_param(&mut bytes, rv));
                req.limit = u64::from(bytes.byte() % 4);
                req.rv_match = match bytes.byte() % 3 {
                    0 => None,
                    1 => Some(RvMatch::Exact),
                    _ => Some(RvMatch::NotOlderThan),
                };
                let _ = c.list(t, req);
            }
            13 => {
                let key = alloc::format!("/pods/ns/{}", bytes.byte() % 6);
                let _ = c.get(
                    t,
                    GetRequest { key: Key::from(key.as_str()), rv: rv_param(&mut bytes, rv) },
                );
            }
            14 => {
                if let Some(&id) = pick(&mut bytes, &watches) {
                    c.grant_credit(t, id, u64::from(bytes.byte() % 8));
                }
            }
            _ => {
                // Answer storage questions the way a host would.
                rv += u64::from(bytes.byte() % 2);
            }
        }
        while let Some(out) = c.poll_output() {
            if let crate::Output::NeedCurrentRevision { request } = out {
                c.handle_current_revision(t, request, rv.max(c.resource_version()));
            }
        }
        while let Some((due, _)) = c.poll_timeout() {
            if due > t {
                break;
            }
            c.handle_timeout(due);
            while c.poll_output().is_some() {}
        }
        c.check_invariants();
    }
}

fn object(bytes: &mut Bytes<'_>, i: u8, rv: u64) -> Object {
    let key = alloc::format!("/pods/ns/{}", i % 6);
    let labels: &[(&str, &str)] = if bytes.bit() { &[("app", "web")] } else { &[] };
    let node = alloc::format!("n{}", bytes.byte() % 3);
    Object::new(key.as_bytes(), Some(b"v"), rv).with_attrs(Attrs::new(
        labels.iter().copied(),
        [("metadata.namespace", "ns"), ("spec.nodeName", node.as_str())],
    ))
}

fn range(bytes: &mut Bytes<'_>) -> KeyRange {
    match bytes.byte() % 4 {
        0 => KeyRange::Prefix(Key::from("/pods/")),
        1 => KeyRange::Prefix(Key::from("/pods/ns")),
        2 => KeyRange::Exact(Key::from("/pods/ns/1")),
        _ => KeyRange::Range { start: Key::from("/pods/ns/1"), end: Some(Key::from("/pods/ns/4")) },
    }
}

fn rv_param(bytes: &mut Bytes<'_>, rv: u64) -> RvParam {
    match bytes.byte() % 4 {
        0 => RvParam::Unset,
        1 => RvParam::Zero,
        _ => RvParam::At((rv + 2).saturating_sub(u64::from(bytes.byte() % 8)).max(1)),
    }
}

fn pick<'a, T>(bytes: &mut Bytes<'_>, v: &'a [T]) -> Option<&'a T> {
    if v.is_empty() {
        return None;
    }
    v.get(bytes.byte() as usize % v.len())
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn peek(&self) -> u8 {
        self.0.first().copied().unwrap_or(0)
    }
    fn bit(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
