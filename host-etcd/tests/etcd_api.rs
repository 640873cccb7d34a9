//! The etcd gRPC API through watchcache, compared with etcd's own answers to the same requests:
//! watches (prefix, range, key, from-key; start revisions now, inside the window, outside it,
//! compacted; prev_kv; filters; client-chosen ids; progress), ranges, and pass-through writes.
//! A real etcd is started by each test on free loopback ports.

use crate::support;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions,
};
use host_etcd::EtcdOptions;
use support::conformance::{check, check_prev_kv, collect, history, Recorded};
use support::Env;

const T: Duration = Duration::from_secs(15);

/// Writes a history with overwrites, deletes and multi-key transactions; returns etcd's
/// revision after it.
async fn write_history(c: &mut Client, tag: &str, n: usize) -> i64 {
    let mut rev = 0;
    for i in 0..n {
        let key = format!("/a/{}", i % 7);
        rev = c
            .put(key.clone(), format!("{tag}-{i}"), None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
        if i % 5 == 4 {
            rev = c.delete(key, None).await.expect("delete").header().expect("h").revision();
        }
        if i % 6 == 5 {
            let txn = Txn::new().and_then(vec![
                TxnOp::put(format!("/a/t{i}"), "x", None),
                TxnOp::put(format!("/b/t{i}"), "y", None),
                TxnOp::put(format!("/a/{}", (i + 1) % 7), format!("{tag}-txn-{i}"), None),
            ]);
            rev = c.txn(txn).await.expect("txn").header().expect("h").revision();
        }
        if i % 4 == 0 {
            rev = c
                .put(format!("/b/{i}"), "b", None)
                .await
                .expect("put")
                .header()
                .expect("h")
                .revision();
        }
    }
    rev
}

struct WatchCase {
    name: String,
    key: &'static str,
    end: &'static str,
    start: i64,
    prev_kv: bool,
    no_delete: bool,
}

fn options(c: &WatchCase) -> WatchOptions {
    let mut o = WatchOptions::new().with_start_revision(c.start);
    if !c.end.is_empty() {
        o = o.with_range(c.end);
    }
    if c.prev_kv {
        o = o.with_prev_key();
    }
    if c.no_delete {
        o = o.with_filters([WatchFilterType::NoDelete]);
    }
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_match_etcd_and_keep_its_guarantees() {
    support::init_tracing();
    // A small fixed window so that old start revisions fall outside it.
    let env = Env::start_with_window(40).await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let r0 = write_history(&mut direct, "h", 60).await;
    env.wait_cache_rev(r0).await;
    let window = env.server().caches()[0].status().oldest_servable.expect("window");
    assert!(window > 5, "the window should have slid: oldest servable {window}");

    let ranges = [
        ("prefix /a/", "/a/", "/a0"),
        ("range [/a/1,/a/5)", "/a/1", "/a/5"),
        ("key /a/3", "/a/3", ""),
        ("from /b", "/b", "\0"),
    ];
    let starts = [("now", 0), ("inside", r0 - 8), ("outside", 2)];
    let mut cases = Vec::new();
    for (rn, key, end) in ranges {
        for (sn, start) in starts {
            for prev_kv in [false, true] {
                for no_delete in [false, true] {
                    cases.push(WatchCase {
                        name: format!(
                            "{rn} from {sn}({start}) prev_kv={prev_kv} nodelete={no_delete}"
                        ),
                        key,
                        end,
                        start,
                        prev_kv,
                        no_delete,
                    });
                }
            }
        }
    }
    let mut streams = Vec::new();
    for c in &cases {
        let d = direct.watch(c.key, Some(options(c))).await.expect("direct watch");
        let w = cached.watch(c.key, Some(options(c))).await.expect("cached watch");
        streams.push((d, w));
    }
    // Let every watch be created before the writes that "now" watches must see.
    let mut recs = Vec::new();
    for (c, (d, w)) in cases.iter().zip(streams.iter_mut()) {
        let mut rd = Recorded {
            name: format!("etcd: {}", c.name),
            key: c.key.into(),
            range_end: c.end.into(),
            start_rev: c.start,
            no_delete: c.no_delete,
            ..Default::default()
        };
        let mut rw = Recorded { name: format!("watchcache: {}", c.name), ..rd.clone() };
        let m = d.message().await.expect("created").expect("created");
        rd.created_rev = m.header().map_or(0, |h| h.revision());
        rd.responses.push(support::conformance::resp_of(&m));
        let m = w.message().await.expect("created").expect("created");
        assert!(m.created(), "{}: first response is created", c.name);
        rw.created_rev = m.header().map_or(0, |h| h.revision());
        rw.responses.push(support::conformance::resp_of(&m));
        recs.push((rd, rw));
    }
    let r1 = write_history(&mut direct, "live", 30).await;
    let hist = history(&mut direct, r1).await;
    let mut violations = Vec::new();
    for ((c, (d, w)), (rd, rw)) in cases.iter().zip(streams.iter_mut()).zip(recs.iter_mut()) {
        // Every watch sees its last event by r1 (or nothing more after it): wait for r1 via a
        // progress request once the events are in.
        collect_all(d, rd, r1).await;
        collect_all(w, rw, r1).await;
        let de: Vec<_> = rd.events().cloned().collect();
        let we: Vec<_> = rw.events().cloned().collect();
        if de != we {
            violations.push(format!(
                "{}: events differ from etcd's: etcd {} events, watchcache {}",
                c.name,
                de.len(),
                we.len()
            ));
        }
        violations.extend(check(&hist, rw));
        if c.prev_kv {
            violations.extend(check_prev_kv(&hist, rw));
        }
        if c.no_delete && rw.events().any(|e| e.delete) {
            violations.push(format!("{}: NODELETE watch got a delete", c.name));
        }
    }
    assert!(violations.is_empty(), "{} violations:\n{}", violations.len(), violations.join("\n"));
    // The transaction's keys under /a/ arrived in one response.
    let txn_rev = hist.iter().find(|e| e.key.starts_with(b"/a/t")).map(|e| e.rev).expect("a txn");
    let prefix_now = &recs[0].1;
    let _ = prefix_now;
    for (_, rw) in &recs {
        let with: Vec<_> =
            rw.responses.iter().filter(|r| r.events.iter().any(|e| e.rev == txn_rev)).collect();
        assert!(with.len() <= 1, "{}: txn revision split", rw.name);
    }
}

/// Collects until the watch's history up to `until` is surely in: ask for progress (answered
/// at or after every event sent).
async fn collect_all(s: &mut etcd_client::WatchStream, rec: &mut Recorded, until: i64) {
    s.request_progress().await.expect("progress request");
    collect(s, rec, until, T).await;
    assert!(
        rec.last_rev() >= until || rec.canceled().is_some(),
        "{}: stuck at {} < {until}: {:?}",
        rec.name,
        rec.last_rev(),
        rec.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_inside_the_window_create_no_etcd_watch() {
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.core.capacity = 50;
        cfg.cache.core.lower_bound_capacity = 50;
        cfg.cache.core.upper_bound_capacity = 50;
        cfg.cache.core.dynamic_capacity = false;
        cfg.cache.rejoin_interval = Duration::from_millis(100);
    })
    .await;
    let mut direct = env.direct().await;
    let r0 = write_history(&mut direct, "h", 80).await;
    env.wait_cache_rev(r0).await;
    let before = env.etcd_metric("etcd_debugging_mvcc_watcher_total", "").await;
    let mut cached = env.cached().await;
    let mut streams = Vec::new();
    for i in 0..20 {
        let s = cached
            .watch(
                "/a/",
                Some(WatchOptions::new().with_prefix().with_start_revision(r0 - (i % 10))),
            )
            .await
            .expect("watch");
        streams.push(s);
    }
    for s in &mut streams {
        let m = s.message().await.expect("msg").expect("created");
        assert!(m.created());
    }
    let during = env.etcd_metric("etcd_debugging_mvcc_watcher_total", "").await;
    assert_eq!(during, before, "watches inside the window must not reach etcd");
    assert_eq!(env.cache_metric("watchcache_watch_requests_total", "source=\"etcd\"").await, 0.0);

    // From revision 2, outside the window: etcd serves it, then it moves onto the cache.
    let mut old = cached
        .watch("/a/", Some(WatchOptions::new().with_prefix().with_start_revision(2)))
        .await
        .expect("watch");
    let mut rec = Recorded {
        name: "outside".into(),
        key: b"/a/".to_vec(),
        range_end: b"/a0".to_vec(),
        start_rev: 2,
        ..Default::default()
    };
    collect(&mut old, &mut rec, r0, T).await;
    assert_eq!(env.cache_metric("watchcache_watch_requests_total", "source=\"etcd\"").await, 1.0);
    let mut rejoined = false;
    for _ in 0..100 {
        if env.cache_metric("watchcache_passthrough_rejoins_total", "").await >= 1.0 {
            rejoined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rejoined, "the pass-through watch should rejoin the cache once caught up");
    let after = env.etcd_metric("etcd_debugging_mvcc_watcher_total", "").await;
    assert_eq!(after, before, "after rejoining, no extra etcd watch remains");
    // And it keeps its guarantees across the switch.
    let r1 = write_history(&mut direct, "more", 20).await;
    collect_all(&mut old, &mut rec, r1).await;
    let hist = history(&mut direct, r1).await;
    let v = check(&hist, &rec);
    assert!(v.is_empty(), "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_revisions_are_refused_as_etcd_refuses_them() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let r0 = write_history(&mut direct, "h", 30).await;
    env.wait_cache_rev(r0).await;
    let compact_at = r0 - 5;
    cached.compact(compact_at, None).await.expect("compact through the cache");
    for (name, client) in [("etcd", &mut direct), ("watchcache", &mut cached)] {
        let mut s = client
            .watch("/a/", Some(WatchOptions::new().with_prefix().with_start_revision(3)))
            .await
            .expect("watch");
        let mut rec = Recorded { name: name.into(), ..Default::default() };
        collect(&mut s, &mut rec, i64::MAX, Duration::from_secs(5)).await;
        let c =
            rec.canceled().unwrap_or_else(|| panic!("{name}: not canceled: {:?}", rec.responses));
        assert_eq!(c.compact_rev, compact_at, "{name}: compact revision");
        assert!(rec.events().next().is_none(), "{name}: no events before the cancel");
    }
    // A range at a compacted revision fails the same way.
    let d = direct
        .get("/a/", Some(GetOptions::new().with_prefix().with_revision(3)))
        .await
        .expect_err("compacted");
    let w = cached
        .get("/a/", Some(GetOptions::new().with_prefix().with_revision(3)))
        .await
        .expect_err("compacted");
    assert_eq!(d.to_string(), w.to_string());
    // Revisions after the compaction still come from the cache.
    let ok = cached
        .get("/a/", Some(GetOptions::new().with_prefix().with_revision(compact_at + 1)))
        .await
        .expect("range");
    let want = direct
        .get("/a/", Some(GetOptions::new().with_prefix().with_revision(compact_at + 1)))
        .await
        .expect("range");
    assert_eq!(ok.kvs().len(), want.kvs().len());
}

/// etcd reads an event's previous value at the revision before it when it sends the event,
/// and sends none when that revision is compacted: a watch from the compaction revision gets
/// its first event there without `prev_kv`, the next ones with it. Found by
/// `random_requests` (seed 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prev_kv_at_the_compaction_revision_is_etcds() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    direct.put("/p/k", "v1", None).await.expect("put");
    direct.put("/p/other", "o", None).await.expect("put");
    let at = direct.put("/p/k", "v2", None).await.expect("put").header().expect("h").revision();
    direct.put("/p/k", "v3", None).await.expect("put");
    let last = direct.delete("/p/k", None).await.expect("delete").header().expect("h").revision();
    env.wait_cache_rev(last).await;
    cached.compact(at, None).await.expect("compact through the cache");
    let mut got = Vec::new();
    for (name, client) in [("etcd", &mut direct), ("watchcache", &mut cached)] {
        let opts = WatchOptions::new().with_prefix().with_start_revision(at).with_prev_key();
        let mut s = client.watch("/p/", Some(opts)).await.expect("watch");
        let mut rec = Recorded { name: name.into(), ..Default::default() };
        collect(&mut s, &mut rec, last, T).await;
        let prevs: Vec<_> = rec.events().map(|e| (e.rev, e.prev.clone())).collect();
        got.push(prevs);
    }
    assert_eq!(got[0].len(), 3, "etcd: {:?}", got[0]);
    assert_eq!(got[0][0].1, None, "etcd: no prev_kv at the compaction revision");
    assert!(got[0][1].1.is_some(), "etcd: prev_kv after it");
    assert_eq!(got[1], got[0], "watchcache against etcd");
}

/// etcd sends a watch that catches up with its history up to 1 000 revisions in one response,
/// however large (its gRPC server's send limit is 2 GiB, clientv3's receive limit too): 48
/// values of 128 KiB from before the window come in one 6 MiB response. Passed through, that
/// response must reach the client whole; with tonic's 4 MiB default the relay failed, was
/// opened again and failed again for ever, and the watch got nothing; a Range passed through
/// failed the same way. Found by `random_slow_readers` (seed 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_watch_takes_etcd_responses_of_any_size() {
    let env = Env::start_with_window(10).await;
    let mut direct = env.direct().await;
    let value = vec![b'v'; 128 << 10];
    let mut first = 0;
    let mut last = 0;
    for i in 0..48 {
        let r = direct.put(format!("/big/{i}"), value.clone(), None).await.expect("put");
        last = r.header().expect("header").revision();
        if i == 0 {
            first = last;
        }
    }
    env.wait_cache_rev(last).await;
    let mut counts = Vec::new();
    for endpoint in [env.etcd.endpoint(), env.grpc()] {
        let client = support::connect(&endpoint, None).await;
        let opts = WatchOptions::new().with_prefix().with_start_revision(first);
        let mut s = client
            .watch_client()
            .max_decoding_message_size(1 << 30)
            .watch("/big/", Some(opts))
            .await
            .expect("watch");
        let mut rec = Recorded { name: endpoint.clone(), ..Default::default() };
        collect(&mut s, &mut rec, last, T).await;
        assert!(rec.error.is_none(), "{endpoint}: {:?}", rec.error);
        counts.push(rec.events().count());
    }
    assert_eq!(counts, [48, 48], "events from etcd, from watchcache");
    // A Range the cache passes through (sorted by value): one 6 MiB response from both.
    let mut kvs = Vec::new();
    for endpoint in [env.etcd.endpoint(), env.grpc()] {
        let client = support::connect(&endpoint, None).await;
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_sort(etcd_client::SortTarget::Value, etcd_client::SortOrder::Descend);
        let r =
            client.kv_client().max_decoding_message_size(1 << 30).get("/big/", Some(opts)).await;
        kvs.push(r.map(|r| r.kvs().len()).map_err(|e| e.to_string()));
    }
    assert_eq!(kvs, [Ok(48), Ok(48)], "a sorted Range from etcd, from watchcache");
}

/// A watch created with `fragment` gets a response of etcd's request limit with its gRPC
/// overhead (1.5 MiB + 512 KiB) or more as fragments, as etcd sends them: one revision's two
/// events of 1.4 MiB each (values with their previous values) arrive as two responses, the
/// first marked as a fragment; at 1 MiB each (2 000 000 bytes) they stay one, from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_watch_responses_are_etcds() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    // Values of 500 KiB: two events with their previous values, 2 000 000 bytes, one response;
    // of 700 KiB: two responses.
    for (kib, responses) in [(500, 1), (700, 2)] {
        let prefix = format!("/f{kib}/");
        let (a, b) = (format!("{prefix}a"), format!("{prefix}b"));
        let big = |c: char| c.to_string().repeat(kib << 10);
        direct.put(a.clone(), big('a'), None).await.expect("put");
        direct.put(b.clone(), big('b'), None).await.expect("put");
        let txn = Txn::new()
            .and_then(vec![TxnOp::put(a.clone(), big('c'), None), TxnOp::put(b, big('d'), None)]);
        let rev = direct.txn(txn).await.expect("txn").header().expect("h").revision();
        env.wait_cache_rev(rev).await;
        let mut got = Vec::new();
        for ep in [env.etcd.endpoint(), env.grpc()] {
            let end = format!("/f{kib}0");
            got.push(support::fragment_shapes(&ep, &prefix, &end, rev, 2).await);
        }
        assert_eq!(got[0].len(), responses, "{kib} KiB: etcd's responses: {:?}", got[0]);
        if responses == 2 {
            assert!(got[0][0].0 && !got[0][1].0, "etcd marks the first: {:?}", got[0]);
        } else {
            assert!(!got[0][0].0, "one response, not a fragment: {:?}", got[0]);
        }
        assert_eq!(got[1], got[0], "{kib} KiB: watchcache against etcd");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_requests_are_answered_locally() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let mut s = cached.watch("/a/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
    s.message().await.expect("created").expect("created");
    s.watch("/b/", Some(WatchOptions::new().with_prefix())).await.expect("second watch");
    s.message().await.expect("created").expect("created");
    let r0 = write_history(&mut direct, "h", 10).await;
    env.wait_cache_rev(r0).await;
    let before = env.etcd_metric("grpc_server_msg_received_total", "grpc_method=\"Watch\"").await;
    let relayed = env.server().metrics().upstream_requests("progress");
    let mut rec = Recorded {
        name: "progress".into(),
        key: b"/".to_vec(),
        range_end: b"0".to_vec(),
        ..Default::default()
    };
    s.request_progress().await.expect("progress");
    let start = std::time::Instant::now();
    loop {
        let m = tokio::time::timeout(T, s.message())
            .await
            .expect("answer in time")
            .expect("msg")
            .expect("msg");
        let r = support::conformance::resp_of(&m);
        rec.responses.push(r.clone());
        if r.is_progress() {
            assert_eq!(r.watch_id, -1, "a requested progress answer has watch id -1, as etcd's");
            assert_eq!(r.header_rev, r0, "everything up to etcd's revision was sent");
            break;
        }
    }
    let took = start.elapsed();
    let after = env.etcd_metric("grpc_server_msg_received_total", "grpc_method=\"Watch\"").await;
    // The answer needs etcd's current revision: on one member, a revision probe on the
    // cache's own watch stream (a create and a cancel); the client's request is not relayed.
    assert!(after - before <= 2.0, "etcd got {} watch messages", after - before);
    assert_eq!(
        env.server().metrics().upstream_requests("progress"),
        relayed,
        "the progress request did not reach etcd"
    );
    assert!(took < Duration::from_secs(2), "answered in {took:?}");
    // etcd answers the same request the same way.
    let mut d = direct.watch("/a/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
    d.message().await.expect("created").expect("created");
    d.request_progress().await.expect("progress");
    let m = d.message().await.expect("msg").expect("msg");
    assert_eq!((m.watch_id(), m.header().map(|h| h.revision())), (-1, Some(r0)));
}

/// etcd answers no progress request while the stream holds a watch it ended as compacted
/// (`progressIfSync` finds that watcher in neither of its groups), until the client cancels the
/// watch, as clientv3 does; then it answers again. watchcache, in front of the same etcd, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_progress_while_a_watch_ended_as_compacted_is_held_as_on_etcd() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let r0 = write_history(&mut direct, "c", 10).await;
    cached.compact(r0 - 3, None).await.expect("compact through the cache");
    env.wait_cache_rev(r0).await;
    let mut seen = Vec::new();
    for client in [&mut direct, &mut cached] {
        let mut s =
            client.watch("/a/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
        let m = s.message().await.expect("created").expect("created");
        assert!(m.created(), "{m:?}");
        // A watch from below the compaction: created, then ended as compacted.
        let o = WatchOptions::new().with_prefix().with_start_revision(r0 - 5);
        s.watch("/a/", Some(o)).await.expect("second watch");
        let mut got = Vec::new();
        let mut ended = None;
        while ended.is_none() {
            let m = tokio::time::timeout(T, s.message()).await.expect("in time").expect("msg");
            let m = m.expect("msg");
            if m.canceled() {
                ended = Some(m.watch_id());
            }
            got.push(format!(
                "id {} created {} compact {}",
                m.watch_id(),
                m.created(),
                m.compact_revision()
            ));
        }
        s.request_progress().await.expect("progress");
        let quiet = tokio::time::timeout(Duration::from_millis(1500), s.message()).await;
        let answer = quiet.ok().and_then(|m| m.ok().flatten()).map(|m| m.watch_id());
        got.push(format!("within 1.5 s while held: {answer:?}"));
        s.cancel(ended.expect("ended")).await.expect("cancel");
        s.request_progress().await.expect("progress");
        for _ in 0..2 {
            let m = tokio::time::timeout(T, s.message()).await.expect("in time").expect("msg");
            let m = m.expect("msg");
            let rev = m.header().map_or(0, |h| h.revision());
            got.push(format!("id {} canceled {} at {}", m.watch_id(), m.canceled(), rev - r0));
        }
        seen.push(got);
    }
    assert_eq!(
        seen[0][2], "within 1.5 s while held: None",
        "etcd answered progress while it held a compacted watch: {:?}",
        seen[0]
    );
    assert_eq!(seen[1], seen[0], "watchcache against etcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watches_get_periodic_progress_notifications() {
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.progress_notify_interval = Duration::from_millis(300)
    })
    .await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let r0 = write_history(&mut direct, "h", 5).await;
    env.wait_cache_rev(r0).await;
    let mut s = cached
        .watch(
            "/a/",
            Some(WatchOptions::new().with_prefix().with_progress_notify().with_watch_id(42)),
        )
        .await
        .expect("watch");
    let created = s.message().await.expect("created").expect("created");
    assert_eq!(created.watch_id(), 42);
    let m = tokio::time::timeout(Duration::from_secs(3), s.message())
        .await
        .expect("a notification")
        .expect("ok")
        .expect("msg");
    let r = support::conformance::resp_of(&m);
    assert!(r.is_progress(), "{r:?}");
    assert_eq!((r.watch_id, r.header_rev), (42, r0));
    // After an event, the next notification is at or after it.
    let r1 = direct.put("/a/x", "1", None).await.expect("put").header().expect("h").revision();
    let mut rec = Recorded {
        name: "periodic".into(),
        key: b"/a/".to_vec(),
        range_end: b"/a0".to_vec(),
        start_rev: r0 + 1,
        ..Default::default()
    };
    rec.responses.push(r);
    collect(&mut s, &mut rec, r1, T).await;
    let m = tokio::time::timeout(Duration::from_secs(3), s.message())
        .await
        .expect("a notification")
        .expect("ok")
        .expect("msg");
    let r = support::conformance::resp_of(&m);
    assert!(r.is_progress() && r.header_rev >= r1, "{r:?}");
    rec.responses.push(r);
    let hist = history(&mut direct, r1).await;
    let v = check(&hist, &rec);
    assert!(v.is_empty(), "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ids_behave_as_etcds() {
    let env = Env::start().await;
    let mut answers = Vec::new();
    for client in [env.direct().await, env.cached().await] {
        let mut client = client;
        let mut s = client
            .watch("/x/", Some(WatchOptions::new().with_prefix().with_watch_id(7)))
            .await
            .expect("watch");
        let mut got = Vec::new();
        let m = s.message().await.expect("ok").expect("msg");
        got.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        // A duplicate id, then two automatic ids, then a cancel.
        s.watch("/y/", Some(WatchOptions::new().with_prefix().with_watch_id(7)))
            .await
            .expect("send");
        let m = s.message().await.expect("ok").expect("msg");
        got.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        for _ in 0..2 {
            s.watch("/z/", Some(WatchOptions::new().with_prefix())).await.expect("send");
            let m = s.message().await.expect("ok").expect("msg");
            got.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        }
        s.cancel(7).await.expect("cancel");
        let m = s.message().await.expect("ok").expect("msg");
        got.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        // Cancelling an unknown id gets no answer; the stream keeps working.
        s.cancel(12345).await.expect("cancel");
        s.watch("/w/", Some(WatchOptions::new().with_prefix().with_watch_id(99)))
            .await
            .expect("send");
        let m = s.message().await.expect("ok").expect("msg");
        got.push((m.watch_id(), m.created(), m.canceled(), m.cancel_reason().to_owned()));
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1], "etcd vs watchcache");
}

/// Ranges from the cache answer exactly what etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_match_etcd() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    for i in 0..40 {
        direct.put(format!("/r/{i:02}"), format!("v{i}"), None).await.expect("put");
    }
    let mid = env.etcd_rev().await;
    for i in 0..40 {
        if i % 3 == 0 {
            direct.put(format!("/r/{i:02}"), format!("w{i}"), None).await.expect("put");
        }
        if i % 7 == 0 {
            direct.delete(format!("/r/{i:02}"), None).await.expect("delete");
        }
    }
    let lease = direct.lease_grant(600, None).await.expect("lease").id();
    direct.put("/r/leased", "l", Some(PutOptions::new().with_lease(lease))).await.expect("put");
    let now = env.etcd_rev().await;
    env.wait_cache_rev(now).await;
    let cases: Vec<(&str, &str, Option<GetOptions>)> = vec![
        ("one key", "/r/05", None),
        ("missing key", "/r/nope", None),
        ("leased key", "/r/leased", None),
        ("prefix", "/r/", Some(GetOptions::new().with_prefix())),
        ("range", "/r/10", Some(GetOptions::new().with_range("/r/20"))),
        ("from key", "/r/30", Some(GetOptions::new().with_from_key())),
        ("limit", "/r/", Some(GetOptions::new().with_prefix().with_limit(5))),
        ("limit beyond", "/r/", Some(GetOptions::new().with_prefix().with_limit(500))),
        ("keys only", "/r/", Some(GetOptions::new().with_prefix().with_keys_only())),
        ("count only", "/r/", Some(GetOptions::new().with_prefix().with_count_only())),
        (
            "count only limit",
            "/r/",
            Some(GetOptions::new().with_prefix().with_count_only().with_limit(3)),
        ),
        ("serializable", "/r/", Some(GetOptions::new().with_prefix().with_serializable())),
        ("at a revision", "/r/", Some(GetOptions::new().with_prefix().with_revision(mid))),
        (
            "at a revision, limit",
            "/r/",
            Some(GetOptions::new().with_prefix().with_revision(mid).with_limit(4)),
        ),
        ("future revision", "/r/", Some(GetOptions::new().with_prefix().with_revision(now + 100))),
        (
            "sorted descending (etcd)",
            "/r/",
            Some(GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Descend)),
        ),
        (
            "sorted by value (etcd)",
            "/r/",
            Some(GetOptions::new().with_prefix().with_sort(SortTarget::Value, SortOrder::Ascend)),
        ),
        ("empty range", "/r/20", Some(GetOptions::new().with_range("/r/10"))),
    ];
    let before_cache =
        env.cache_metric("watchcache_range_requests_total", "source=\"cache\"").await;
    for (name, key, opts) in cases {
        let d = direct.get(key, opts.clone()).await;
        let w = cached.get(key, opts).await;
        match (d, w) {
            (Ok(d), Ok(w)) => {
                let kv = |r: &etcd_client::GetResponse| {
                    r.kvs()
                        .iter()
                        .map(|k| {
                            (
                                k.key().to_vec(),
                                k.value().to_vec(),
                                k.create_revision(),
                                k.mod_revision(),
                                k.version(),
                                k.lease(),
                            )
                        })
                        .collect::<Vec<_>>()
                };
                assert_eq!(kv(&d), kv(&w), "{name}: kvs");
                assert_eq!((d.count(), d.more()), (w.count(), w.more()), "{name}: count, more");
                assert_eq!(
                    d.header().map(|h| h.revision()),
                    w.header().map(|h| h.revision()),
                    "{name}: header revision"
                );
            }
            (Err(d), Err(w)) => assert_eq!(d.to_string(), w.to_string(), "{name}: error"),
            (d, w) => panic!("{name}: etcd {d:?} vs watchcache {w:?}"),
        }
    }
    let after_cache = env.cache_metric("watchcache_range_requests_total", "source=\"cache\"").await;
    assert!(
        after_cache - before_cache >= 13.0,
        "most ranges served from the cache: {}",
        after_cache - before_cache
    );
    // Pagination as clients do it (key after the last, same revision) gives the same pages.
    let mut pages = Vec::new();
    for client in [&mut direct, &mut cached] {
        let mut key = b"/r/".to_vec();
        let mut rev = 0;
        let mut all = Vec::new();
        loop {
            let mut o = GetOptions::new().with_range("/r0").with_limit(7);
            if rev > 0 {
                o = o.with_revision(rev);
            }
            let r = client.get(key.clone(), Some(o)).await.expect("page");
            rev = r.header().expect("h").revision();
            all.extend(r.kvs().iter().map(|k| k.key().to_vec()));
            match r.kvs().last() {
                Some(last) if r.more() => {
                    key = last.key().to_vec();
                    key.push(0);
                }
                _ => break,
            }
        }
        pages.push(all);
    }
    assert_eq!(pages[0], pages[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_leases_txn_and_maintenance_pass_through() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let mut w = cached
        .watch("/p/", Some(WatchOptions::new().with_prefix().with_prev_key()))
        .await
        .expect("watch");
    w.message().await.expect("ok").expect("created");
    let put = cached.put("/p/a", "1", Some(PutOptions::new().with_prev_key())).await.expect("put");
    assert!(put.prev_key().is_none());
    let put = cached.put("/p/a", "2", Some(PutOptions::new().with_prev_key())).await.expect("put");
    assert_eq!(put.prev_key().map(|k| k.value().to_vec()), Some(b"1".to_vec()));
    // Compare-and-swap.
    let txn = Txn::new()
        .when(vec![Compare::value("/p/a", CompareOp::Equal, "2")])
        .and_then(vec![TxnOp::put("/p/a", "3", None), TxnOp::put("/p/b", "3", None)])
        .or_else(vec![TxnOp::get("/p/a", None)]);
    assert!(cached.txn(txn).await.expect("txn").succeeded());
    // A lease: grant, attach, keep alive (a stream), revoke: the key goes away.
    let lease = cached.lease_grant(30, None).await.expect("grant").id();
    cached.put("/p/leased", "x", Some(PutOptions::new().with_lease(lease))).await.expect("put");
    let (mut keeper, mut responses) = cached.lease_keep_alive(lease).await.expect("keepalive");
    keeper.keep_alive().await.expect("keep alive");
    let ka = responses.message().await.expect("ok").expect("response");
    assert_eq!(ka.id(), lease);
    assert!(ka.ttl() > 0);
    cached.lease_revoke(lease).await.expect("revoke");
    let rev = env.etcd_rev().await;
    assert!(direct.get("/p/leased", None).await.expect("get").kvs().is_empty());
    let deleted = cached
        .delete("/p/b", Some(etcd_client::DeleteOptions::new().with_prev_key()))
        .await
        .expect("delete");
    assert_eq!(deleted.deleted(), 1);
    // The watch saw all of it, in order, with previous values.
    let mut rec = Recorded {
        name: "writes".into(),
        key: b"/p/".to_vec(),
        range_end: b"/p0".to_vec(),
        ..Default::default()
    };
    let last = env.etcd_rev().await;
    collect(&mut w, &mut rec, last, T).await;
    let hist = history(&mut direct, last).await;
    rec.created_rev = hist.iter().find(|e| e.key == b"/p/a").map(|e| e.rev - 1).expect("history");
    let mut v = check(&hist, &rec);
    v.extend(check_prev_kv(&hist, &rec));
    assert!(v.is_empty(), "{v:?}");
    assert!(rec.events().any(|e| e.delete && e.key == b"/p/leased" && e.rev <= rev));
    // Cluster and maintenance calls answer as etcd does.
    let dm = direct.member_list().await.expect("members");
    let cm = cached.member_list().await.expect("members");
    assert_eq!(
        dm.members().iter().map(|m| m.id()).collect::<Vec<_>>(),
        cm.members().iter().map(|m| m.id()).collect::<Vec<_>>()
    );
    let ds = direct.status().await.expect("status");
    let cs = cached.status().await.expect("status");
    assert_eq!(ds.header().map(|h| h.cluster_id()), cs.header().map(|h| h.cluster_id()));
    assert_eq!(ds.version(), cs.version());
}

/// etcd serves HTTP/1 on its client port: the JSON gateway (`/v3/...`), `/health`,
/// `/version`. On watchcache's gRPC port they answer as on etcd's (the connection is spliced to
/// etcd), a gateway watch streams etcd's events, and gRPC on the same port goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_on_the_grpc_port_is_etcds() {
    let env = Env::start().await;
    let (etcd, wc) = (env.etcd.endpoint(), env.grpc());
    for path in ["/health", "/version", "/nothing-here"] {
        let want = support::http1(&etcd, "GET", path, "").await;
        let got = support::http1(&wc, "GET", path, "").await;
        assert_eq!(got, want, "GET {path}");
    }
    // HTTP/2 that is not gRPC: etcd's plain-text port hands all HTTP/2 to its gRPC server, and
    // watchcache passes it through to that same server.
    let want = support::h2_get(&etcd, "/health").await;
    let got = support::h2_get(&wc, "/health").await;
    eprintln!("HTTP/2 GET /health: etcd {want:?}, watchcache {got:?}");
    assert_eq!((got.0, got.1), (want.0, want.1), "HTTP/2 GET /health: status and grpc-status");
    // A put through the gateway on watchcache's port; the same range answered by both.
    let (status, _) =
        support::http1(&wc, "POST", "/v3/kv/put", r#"{"key":"L2cvaw==","value":"djE="}"#).await;
    assert_eq!(status, 200);
    let range = r#"{"key":"L2cvaw=="}"#;
    let parse = |b: &str| serde_json::from_str::<serde_json::Value>(b).expect("JSON");
    let want = parse(&support::http1(&etcd, "POST", "/v3/kv/range", range).await.1);
    let got = parse(&support::http1(&wc, "POST", "/v3/kv/range", range).await.1);
    assert_eq!(got, want);
    assert_eq!(got["kvs"][0]["value"], "djE=");
    // A gateway watch through watchcache's port streams etcd's answer to a put made over gRPC
    // on that same port.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(&wc).await.expect("connect");
    let body = r#"{"create_request":{"key":"L2cvaw=="}}"#;
    let req = format!(
        "POST /v3/watch HTTP/1.1\r\nHost: {wc}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("\"created\":true") {
        let n = tokio::time::timeout(T, s.read(&mut buf)).await.expect("in time").expect("read");
        assert!(n > 0, "the watch ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let mut cached = env.cached().await;
    cached.put("/g/k", "v2", None).await.expect("a gRPC put on the same port");
    while !seen.contains("\"value\":\"djI=\"") {
        let n = tokio::time::timeout(T, s.read(&mut buf)).await.expect("in time").expect("read");
        assert!(n > 0, "the watch ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}
