//! The conformance checker: etcd's watch guarantees (spec/etcd.md section 1.7) applied to
//! recorded watch streams against the ground truth (etcd's own history).
//!
//! Ordered, unique, reliable, atomic, bookmarkable; resumable is reliability of the resumed
//! watch from the last revision + 1.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions, WatchStream};

/// One event as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ev {
    pub rev: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub delete: bool,
    pub create_rev: i64,
    pub version: i64,
    /// The previous value and its mod revision (when asked for).
    pub prev: Option<(Vec<u8>, i64)>,
}

/// One response as a client sees it.
#[derive(Clone, Debug, Default)]
pub struct Resp {
    pub header_rev: i64,
    pub watch_id: i64,
    pub events: Vec<Ev>,
    pub created: bool,
    pub canceled: bool,
    pub compact_rev: i64,
    pub cancel_reason: String,
}

impl Resp {
    /// clientv3's rule for a progress notification.
    pub fn is_progress(&self) -> bool {
        self.events.is_empty()
            && !self.created
            && !self.canceled
            && self.compact_rev == 0
            && self.header_rev != 0
    }
}

/// A recorded watch.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub name: String,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    /// The start revision asked for (0 = now).
    pub start_rev: i64,
    /// Revision of the `created` response's header.
    pub created_rev: i64,
    pub responses: Vec<Resp>,
    /// The stream ended with this error (an explicit end).
    pub error: Option<String>,
    /// The watch filters out deletes (NODELETE) or puts (NOPUT).
    pub no_delete: bool,
    pub no_put: bool,
}

impl Recorded {
    pub fn events(&self) -> impl Iterator<Item = &Ev> {
        self.responses.iter().flat_map(|r| r.events.iter())
    }

    pub fn last_rev(&self) -> i64 {
        self.responses
            .iter()
            .map(
                |r| {
                    if r.is_progress() {
                        r.header_rev
                    } else {
                        r.events.last().map_or(0, |e| e.rev)
                    }
                },
            )
            .max()
            .unwrap_or(0)
    }

    pub fn canceled(&self) -> Option<&Resp> {
        self.responses.iter().find(|r| r.canceled)
    }
}

pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    let start: &[u8] = if start.is_empty() { &[0] } else { start };
    if end.is_empty() {
        key == start
    } else if end == [0] {
        key >= start
    } else {
        key >= start && key < end
    }
}

pub fn ev_of(e: &etcd_client::Event) -> Ev {
    Ev {
        delete: e.event_type() == EventType::Delete,
        prev: e.prev_kv().map(|p| (p.value().to_vec(), p.mod_revision())),
        ..put_of(e.kv().expect("event has a kv"))
    }
}

/// A key as the put of its mod revision, with no previous value.
fn put_of(kv: &etcd_client::KeyValue) -> Ev {
    Ev {
        rev: kv.mod_revision(),
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        delete: false,
        create_rev: kv.create_revision(),
        version: kv.version(),
        prev: None,
    }
}

pub fn resp_of(r: &etcd_client::WatchResponse) -> Resp {
    Resp {
        header_rev: r.header().map_or(0, |h| h.revision()),
        watch_id: r.watch_id(),
        events: r.events().iter().map(ev_of).collect(),
        created: r.created(),
        canceled: r.canceled(),
        compact_rev: r.compact_revision(),
        cancel_reason: r.cancel_reason().to_owned(),
    }
}

/// A response as a client sees it, from the protobuf (for clients below etcd-client's API).
pub fn resp_of_pb(r: &etcd_client::proto::PbWatchResponse) -> Resp {
    Resp {
        header_rev: r.header.as_ref().map_or(0, |h| h.revision),
        watch_id: r.watch_id,
        events: r
            .events
            .iter()
            .map(|e| {
                let kv = e.kv.clone().unwrap_or_default();
                Ev {
                    rev: kv.mod_revision,
                    key: kv.key,
                    value: kv.value,
                    delete: e.r#type == 1,
                    create_rev: kv.create_revision,
                    version: kv.version,
                    prev: e.prev_kv.as_ref().map(|p| (p.value.clone(), p.mod_revision)),
                }
            })
            .collect(),
        created: r.created,
        canceled: r.canceled,
        compact_rev: r.compact_revision,
        cancel_reason: r.cancel_reason.clone(),
    }
}

/// Reads responses until the watch has seen revision `until` (an event or a progress
/// notification at or past it), it is canceled, or `limit` passes.
pub async fn collect(stream: &mut WatchStream, rec: &mut Recorded, until: i64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while rec.last_rev() < until && rec.canceled().is_none() && rec.error.is_none() {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Ok(Ok(Some(r))) => {
                let r = resp_of(&r);
                if r.created {
                    rec.created_rev = r.header_rev;
                }
                rec.responses.push(r);
            }
            Ok(Ok(None)) => {
                rec.error = Some("stream ended".into());
            }
            Ok(Err(e)) => rec.error = Some(e.to_string()),
            Err(_) => break,
        }
    }
}

/// A watch of every key from revision 1, with previous values, straight from etcd.
pub async fn history_stream(client: &etcd_client::Client) -> WatchStream {
    history_stream_from(client, 1).await
}

/// A watch of every key from revision `from`, with previous values, straight from etcd.
pub async fn history_stream_from(client: &etcd_client::Client, from: i64) -> WatchStream {
    client
        .watch_client()
        .max_decoding_message_size(1 << 30)
        .watch(
            "\0",
            Some(WatchOptions::new().with_range("\0").with_start_revision(from).with_prev_key()),
        )
        .await
        .expect("history watch")
}

/// etcd's whole history from revision 1 (every key, with previous values), as etcd itself
/// reports it.
pub async fn history(client: &mut etcd_client::Client, until: i64) -> Vec<Ev> {
    history_from(client, 1, until).await
}

/// etcd's history from revision `from` (at or above its compaction) to `until`.
pub async fn history_from(client: &mut etcd_client::Client, from: i64, until: i64) -> Vec<Ev> {
    let mut s = history_stream_from(client, from).await;
    let mut rec =
        Recorded { key: vec![0], range_end: vec![0], start_rev: from, ..Default::default() };
    collect(&mut s, &mut rec, until, Duration::from_secs(20)).await;
    assert!(rec.canceled().is_none(), "history compacted: {:?}", rec.canceled());
    assert!(
        rec.last_rev() >= until,
        "history incomplete: at {} of {until}: {:?}",
        rec.last_rev(),
        rec.error
    );
    rec.events().cloned().collect()
}

/// Every key as etcd had it at `rev` (at or above the compaction), as puts at their mod
/// revisions in revision order: what comes before a history that starts at `rev`.
pub async fn keys_at(client: &mut etcd_client::Client, rev: i64) -> Vec<Ev> {
    let o = etcd_client::GetOptions::new().with_range(vec![0]).with_revision(rev);
    let r = client.get(vec![0], Some(o)).await.expect("keys at a revision");
    let mut keys: Vec<Ev> = r.kvs().iter().map(put_of).collect();
    keys.sort_by_key(|e| e.rev);
    keys
}

/// Checks one recorded watch against the history; returns the violations.
pub fn check(history: &[Ev], w: &Recorded) -> Vec<String> {
    let mut v = Vec::new();
    let name = &w.name;
    // Ordered and unique.
    let mut last = 0i64;
    let mut seen = HashSet::new();
    for e in w.events() {
        if e.rev < last {
            v.push(format!("{name}: ordered: revision {} after {last}", e.rev));
        }
        last = last.max(e.rev);
        if !seen.insert((e.rev, e.key.clone())) {
            v.push(format!(
                "{name}: unique: ({}, {:?}) twice",
                e.rev,
                String::from_utf8_lossy(&e.key)
            ));
        }
        if !in_range(&e.key, &w.key, &w.range_end) {
            v.push(format!(
                "{name}: event for a key outside the watch: {:?}",
                String::from_utf8_lossy(&e.key)
            ));
        }
    }
    // Bookmarkable: progress revisions never go down, never below an event received, and no
    // later event is at or below one.
    let mut max_event = 0i64;
    let mut max_progress = 0i64;
    for r in &w.responses {
        if r.is_progress() {
            if r.header_rev < max_progress {
                v.push(format!(
                    "{name}: bookmarkable: progress {} after progress {max_progress}",
                    r.header_rev
                ));
            }
            if r.header_rev < max_event {
                v.push(format!(
                    "{name}: bookmarkable: progress {} below event {max_event}",
                    r.header_rev
                ));
            }
            max_progress = max_progress.max(r.header_rev);
        }
        for e in &r.events {
            if e.rev <= max_progress {
                v.push(format!(
                    "{name}: bookmarkable: event {} after progress {max_progress}",
                    e.rev
                ));
            }
            max_event = max_event.max(e.rev);
        }
    }
    // Reliable and atomic against the history.
    let first = if w.start_rev > 0 { w.start_rev } else { w.created_rev + 1 };
    let compact = w.canceled().map_or(0, |c| c.compact_rev);
    let upto = w.last_rev();
    let want: Vec<&Ev> = history
        .iter()
        .filter(|e| e.rev >= first && e.rev <= upto && in_range(&e.key, &w.key, &w.range_end))
        .filter(|e| if e.delete { !w.no_delete } else { !w.no_put })
        .collect();
    let got: Vec<&Ev> = w.events().collect();
    if compact == 0 || !got.is_empty() {
        let strip = |e: &Ev| Ev { prev: None, ..e.clone() };
        let want_s: Vec<Ev> = want.iter().map(|e| strip(e)).collect();
        let got_s: Vec<Ev> = got.iter().map(|e| strip(e)).collect();
        if want_s != got_s {
            let missing: Vec<i64> =
                want_s.iter().filter(|e| !got_s.contains(e)).map(|e| e.rev).take(10).collect();
            let extra: Vec<i64> =
                got_s.iter().filter(|e| !want_s.contains(e)).map(|e| e.rev).take(10).collect();
            v.push(format!(
                "{name}: reliable: got {} events, etcd's history has {} in [{first}, {upto}]; missing revs {missing:?}, extra revs {extra:?}",
                got_s.len(),
                want_s.len()
            ));
        }
    }
    // Atomic: every revision's events arrive in one response.
    let mut by_rev: BTreeMap<i64, usize> = BTreeMap::new();
    for (i, r) in w.responses.iter().enumerate() {
        for e in &r.events {
            if let Some(&j) = by_rev.get(&e.rev) {
                if j != i {
                    v.push(format!(
                        "{name}: atomic: revision {} split over responses {j} and {i}",
                        e.rev
                    ));
                }
            } else {
                by_rev.insert(e.rev, i);
            }
        }
    }
    v
}

/// Checks that `prev_kv` is right for every event (against the history).
pub fn check_prev_kv(history: &[Ev], w: &Recorded) -> Vec<String> {
    w.events().filter_map(|e| prev_kv_violation(w, e, prev_in(history, e).flatten())).collect()
}

/// `check_prev_kv` for the previous values `w` was sent, where the history goes back to the
/// key's change before the event (one left out is not checked).
pub fn check_prev_kv_sent(history: &[Ev], w: &Recorded) -> Vec<String> {
    w.events()
        .filter(|e| e.prev.is_some())
        .filter_map(|e| prev_kv_violation(w, e, prev_in(history, e)?))
        .collect()
}

/// The previous value the history gives `e` (none after a delete); `None` when the history
/// does not go back to the key's change before it.
fn prev_in(history: &[Ev], e: &Ev) -> Option<Option<(Vec<u8>, i64)>> {
    let before = history.iter().rev().find(|h| h.key == e.key && h.rev < e.rev)?;
    Some((!before.delete).then(|| (before.value.clone(), before.rev)))
}

fn prev_kv_violation(w: &Recorded, e: &Ev, want: Option<(Vec<u8>, i64)>) -> Option<String> {
    (e.prev != want).then(|| {
        format!(
            "{}: prev_kv of {:?}@{}: mod revision {:?} ({} bytes), want {:?} ({} bytes)",
            w.name,
            String::from_utf8_lossy(&e.key),
            e.rev,
            e.prev.as_ref().map(|p| p.1),
            e.prev.as_ref().map_or(0, |p| p.0.len()),
            want.as_ref().map(|p| p.1),
            want.as_ref().map_or(0, |p| p.0.len()),
        )
    })
}
