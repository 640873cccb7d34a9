//! What production needs of an etcd cache, against a real etcd: consistent reads that share
//! one freshness check, compaction done directly on etcd followed within a second, the
//! consistency checker catching a cache that lost an event, RangeStream answered as etcd
//! answers it, and gauges that equal etcd's own counts.

use crate::support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_client::proto::{PbRangeRequest, PbRangeStreamResponse};
use etcd_client::{GetOptions, WatchOptions};
use host_etcd::EtcdOptions;
use support::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_consistent_reads_share_one_freshness_check() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let rev = direct.put("/f/k", "v1", None).await.expect("put").header().expect("h").revision();
    env.wait_cache_rev(rev).await;
    let cached = env.cached().await;
    let checks_now = || {
        let m = env.server().metrics();
        m.upstream_requests("quorum_read") + m.upstream_requests("revision_probe")
    };
    let before = checks_now();
    let reads: Vec<_> = (0..64)
        .map(|_| {
            let mut c = cached.clone();
            tokio::spawn(async move { c.get("/f/k", None).await.expect("get") })
        })
        .collect();
    for r in reads {
        let r = r.await.expect("task");
        assert_eq!(r.kvs()[0].value(), b"v1");
        assert!(
            r.header().expect("h").revision() >= rev,
            "never older than the acknowledged write"
        );
    }
    let checks = checks_now() - before;
    assert!((1..=8).contains(&checks), "64 concurrent consistent reads cost etcd {checks} reads");
    // Read-your-write: a write acknowledged before a consistent read is in its answer.
    for i in 0..20 {
        let v = format!("w{i}");
        direct.put("/f/k", v.clone(), None).await.expect("put");
        let mut c = cached.clone();
        let r = c.get("/f/k", None).await.expect("get");
        assert_eq!(r.kvs()[0].value(), v.as_bytes());
    }
}

/// Sequential linearizable reads through watchcache, each after a write acknowledged to another
/// client; returns the Range requests etcd handled meanwhile.
async fn ranges_for_linearizable_reads(env: &Env, n: usize) -> f64 {
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let ranges = r#"grpc_method="Range""#;
    let before = env.etcd_metric("grpc_server_handled_total", ranges).await;
    for i in 0..n {
        let v = format!("v{i}");
        direct.put("/lin/k", v.clone(), None).await.expect("put");
        let r = cached.get("/lin/k", None).await.expect("get");
        assert_eq!(r.kvs()[0].value(), v.as_bytes(), "read {i} saw the acknowledged write");
    }
    env.etcd_metric("grpc_server_handled_total", ranges).await - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_etcd_member_linearizable_reads_cost_etcd_no_range() {
    let env = Env::start().await;
    // The member list is read at start; wait until reads use revision probes.
    let t = Instant::now();
    let mut cached = env.cached().await;
    while env.server().metrics().upstream_requests("revision_probe") == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "no revision probe after 10 s");
        cached.get("/lin/k", None).await.expect("get");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quorum = env.server().metrics().upstream_requests("quorum_read");
    let ranges = ranges_for_linearizable_reads(&env, 100).await;
    assert!(ranges <= 2.0, "100 linearizable reads cost etcd {ranges} Range requests");
    assert_eq!(env.server().metrics().upstream_requests("quorum_read"), quorum);
    // The same with quorum reads: one Range each (the figure the probe saves).
    drop(env);
    let env = Env::start_with(Default::default(), |c| {
        c.cache.freshness = host_etcd::config::Freshness::Quorum
    })
    .await;
    let ranges = ranges_for_linearizable_reads(&env, 100).await;
    assert!(ranges >= 100.0, "with --freshness quorum: {ranges} Range requests for 100 reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rest_and_at_the_current_revision_the_cache_costs_etcd_no_range() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut rev = 0;
    for i in 0..10 {
        rev = direct
            .put(format!("/r/{i}"), "v", None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
    }
    env.wait_cache_rev(rev).await;
    let mut cached = env.cached().await;
    let ranges = r#"grpc_method="Range""#;
    // Let start-up's reads (the list, the member list) pass.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = env.etcd_metric("grpc_server_handled_total", ranges).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..20 {
        let r = cached
            .get("/r/", Some(GetOptions::new().with_prefix().with_serializable()))
            .await
            .expect("get");
        assert_eq!(r.kvs().len(), 10);
        let mut w =
            cached.watch("/r/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
        assert!(w.message().await.expect("ok").expect("created").created());
    }
    let after = env.etcd_metric("grpc_server_handled_total", ranges).await;
    assert_eq!(after - before, 0.0, "3 s at rest, 20 reads and 20 watches from now");
    // A read at a past revision asks etcd about compaction once, then not for a second.
    for _ in 0..5 {
        cached
            .get("/r/", Some(GetOptions::new().with_prefix().with_revision(rev - 5)))
            .await
            .expect("get");
    }
    let past = env.etcd_metric("grpc_server_handled_total", ranges).await - after;
    assert_eq!(past, 1.0, "5 reads at a past revision in less than a second");
}

fn compacted(e: &etcd_client::Error) -> bool {
    e.to_string().contains("required revision has been compacted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_made_on_etcd_is_followed_within_a_second() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let mut revs = Vec::new();
    for i in 0..20 {
        revs.push(
            direct
                .put(format!("/c/k{i}"), "v", None)
                .await
                .expect("put")
                .header()
                .expect("h")
                .revision(),
        );
    }
    let old = revs[2];
    env.wait_cache_rev(*revs.last().expect("rev")).await;
    // Before: the cache answers a read at an old revision from its snapshots, as etcd would.
    let r = cached
        .get("/c/", Some(GetOptions::new().with_prefix().with_revision(old)))
        .await
        .expect("get");
    assert_eq!(r.kvs().len(), 3);
    let requests_before = env.server().metrics().upstream_requests("range");
    assert_eq!(requests_before, 0, "served from the cache");
    // Someone compacts etcd directly, past `old`.
    direct.compact(revs[10], None).await.expect("compact");
    let t = Instant::now();
    let err = loop {
        match cached.get("/c/", Some(GetOptions::new().with_prefix().with_revision(old))).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    t.elapsed() < Duration::from_millis(1500),
                    "still served from the cache after {:?}",
                    t.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(compacted(&err), "etcd's own error: {err}");
    let direct_err = direct
        .get("/c/", Some(GetOptions::new().with_prefix().with_revision(old)))
        .await
        .expect_err("etcd refuses");
    assert_eq!(err.to_string(), direct_err.to_string());
    // A watch there is cancelled as etcd cancels it.
    let mut w = cached
        .watch("/c/", Some(WatchOptions::new().with_prefix().with_start_revision(old)))
        .await
        .expect("watch");
    let mut compact_rev = 0;
    for _ in 0..3 {
        let m = tokio::time::timeout(Duration::from_secs(5), w.message())
            .await
            .expect("answer")
            .expect("ok")
            .expect("msg");
        if m.canceled() {
            compact_rev = m.compact_revision();
            break;
        }
    }
    assert_eq!(compact_rev, revs[10]);
    // At and above the compaction, still from the cache.
    let r = cached
        .get("/c/", Some(GetOptions::new().with_prefix().with_revision(revs[12])))
        .await
        .expect("get");
    assert_eq!(r.kvs().len(), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consistency_checker_catches_a_lost_event_and_relists() {
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.reflector.consistency_check_interval = Duration::from_millis(300);
    })
    .await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    for i in 0..10 {
        direct.put(format!("/k/{i}"), "v", None).await.expect("put");
    }
    let cache = env.server().caches()[0].clone();
    let wait_for = |status: &'static str, n: u64| {
        let env = &env;
        async move {
            let t = Instant::now();
            while env.server().metrics().consistency_checks(status) < n {
                assert!(t.elapsed() < Duration::from_secs(10), "no {status} check after 10 s");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_for("match", 1).await;
    let generation = cache.status().generation;
    // The cache misses a revision (a lost event): it now disagrees with etcd.
    cache.drop_next_revision_for_test();
    let rev = direct.put("/k/lost", "x", None).await.expect("put").header().expect("h").revision();
    env.wait_cache_rev(rev).await;
    let r = cached.get("/k/lost", Some(GetOptions::new().with_serializable())).await.expect("get");
    assert!(r.kvs().is_empty(), "the hook made the cache miss it");
    wait_for("mismatch", 1).await;
    let t = Instant::now();
    while cache.status().generation == generation || !cache.status().ready {
        assert!(t.elapsed() < Duration::from_secs(10), "no relist after the mismatch");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = cached.get("/k/lost", Some(GetOptions::new().with_serializable())).await.expect("get");
    assert_eq!(r.kvs()[0].value(), b"x", "after the relist the cache holds what etcd holds");
    let state = support::http::get(format!("{}/debug/state", env.http()))
        .await
        .expect("state")
        .text()
        .await
        .expect("text");
    assert!(state.contains("consistency_check"), "{state}");
    assert!(
        env.cache_metric("apiserver_storage_consistency_checks_total", "mismatch").await >= 1.0
    );
}

/// The chunks of a raw RangeStream call.
async fn range_stream(
    endpoint: &str,
    req: &PbRangeRequest,
) -> Result<Vec<PbRangeStreamResponse>, tonic::Status> {
    let mut g = support::grpc(endpoint).await;
    let codec = tonic_prost::ProstCodec::<PbRangeRequest, PbRangeStreamResponse>::default();
    let mut s = g
        .server_streaming(
            tonic::Request::new(req.clone()),
            http::uri::PathAndQuery::from_static("/etcdserverpb.KV/RangeStream"),
            codec,
        )
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.message().await? {
        out.push(m);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_is_answered_from_the_cache_as_etcd_answers_it() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    // Enough data for several chunks: 600 keys of 8 KiB.
    let value = Bytes::from(vec![b'x'; 8 << 10]);
    let mut mid = 0;
    for i in 0..600 {
        let r = direct.put(format!("/s/{i:04}"), value.to_vec(), None).await.expect("put");
        if i == 300 {
            mid = r.header().expect("h").revision();
        }
    }
    let last = env.etcd_rev().await;
    env.wait_cache_rev(last).await;
    let end = b"/s0".to_vec();
    let cases = [
        (
            "all",
            PbRangeRequest { key: b"/s/".to_vec(), range_end: end.clone(), ..Default::default() },
        ),
        (
            "limit",
            PbRangeRequest {
                key: b"/s/".to_vec(),
                range_end: end.clone(),
                limit: 55,
                ..Default::default()
            },
        ),
        (
            "keys only",
            PbRangeRequest {
                key: b"/s/".to_vec(),
                range_end: end.clone(),
                keys_only: true,
                ..Default::default()
            },
        ),
        (
            "count only",
            PbRangeRequest {
                key: b"/s/".to_vec(),
                range_end: end.clone(),
                count_only: true,
                ..Default::default()
            },
        ),
        (
            "at a revision",
            PbRangeRequest {
                key: b"/s/".to_vec(),
                range_end: end.clone(),
                revision: mid,
                serializable: true,
                ..Default::default()
            },
        ),
        ("one key", PbRangeRequest { key: b"/s/0007".to_vec(), ..Default::default() }),
        (
            "nothing",
            PbRangeRequest {
                key: b"/none/".to_vec(),
                range_end: b"/none0".to_vec(),
                ..Default::default()
            },
        ),
    ];
    let served_before = env.server().metrics().ranges().0;
    for (name, req) in &cases {
        let want = range_stream(&env.etcd.endpoint(), req).await.expect("etcd");
        let got = range_stream(&env.grpc(), req).await.expect("watchcache");
        let sizes = |v: &[PbRangeStreamResponse]| {
            v.iter()
                .map(|c| c.range_response.as_ref().map_or(0, |r| r.kvs.len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(&got), sizes(&want), "{name}: the same chunks");
        if *name == "all" {
            assert!(want.len() > 3, "several chunks: {:?}", sizes(&want));
        }
        assert_eq!(got, want, "{name}: the same answer");
    }
    assert!(
        env.server().metrics().ranges().0 >= served_before + cases.len() as u64 - 1,
        "served from the cache"
    );
    // What the cache does not serve goes to etcd, errors included.
    let sorted = PbRangeRequest {
        key: b"/s/".to_vec(),
        range_end: end,
        sort_order: 2,
        ..Default::default()
    };
    let e1 = range_stream(&env.etcd.endpoint(), &sorted).await.expect_err("etcd refuses");
    let e2 = range_stream(&env.grpc(), &sorted).await.expect_err("refused");
    assert_eq!((e1.code(), e1.message()), (e2.code(), e2.message()));
    // Outside the cached prefix (`/`), etcd's chunks reach the client as etcd sent them.
    for i in 0..100 {
        direct.put(format!("u/{i:03}"), value.to_vec(), None).await.expect("put");
    }
    let outside =
        PbRangeRequest { key: b"u/".to_vec(), range_end: b"u0".to_vec(), ..Default::default() };
    let passed = env.server().metrics().upstream_requests("range_stream");
    let want = range_stream(&env.etcd.endpoint(), &outside).await.expect("etcd");
    let got = range_stream(&env.grpc(), &outside).await.expect("watchcache");
    assert!(want.len() > 3, "several chunks: {}", want.len());
    assert_eq!(got, want, "a RangeStream outside the cached prefix, passed through");
    assert_eq!(env.server().metrics().upstream_requests("range_stream"), passed + 1);
}

/// etcd's watcher count and watchcache's upstream-watch gauge, once they agree (10 s at most).
async fn settle(env: &Env) -> (f64, f64) {
    let t = Instant::now();
    loop {
        let a = env.etcd_metric("etcd_debugging_mvcc_watcher_total", "").await;
        let b = env.server().metrics().upstream_watches() as f64;
        if a == b || t.elapsed() > Duration::from_secs(10) {
            return (a, b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_watch_gauge_equals_etcds_watcher_count() {
    let mut env = Env::start().await;
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "at start (the cache's own watch)");
    let mut cached = env.cached().await;
    // Watches etcd serves: keys outside... the default prefix is "/": use an old revision.
    let mut direct = env.direct().await;
    for i in 0..5 {
        direct.put(format!("/g/{i}"), "v", None).await.expect("put");
    }
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut s = cached.watch("\u{1}outside", None).await.expect("watch");
        let m = s.message().await.expect("ok").expect("created");
        assert!(m.created());
        streams.push((s, m.watch_id()));
    }
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "with three relayed watches");
    let (s0, id) = &mut streams[0];
    s0.cancel(*id).await.expect("cancel");
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "after a cancel");
    drop(streams);
    drop(cached);
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "after the streams ended");
    // A restart of etcd: relays and the cache's own watch come back.
    let mut cached = env.cached().await;
    let mut s = cached.watch("\u{1}outside", None).await.expect("watch");
    s.message().await.expect("ok").expect("created");
    env.etcd.kill().await;
    env.etcd.restart(EtcdOptions::default()).await.expect("etcd restarts");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "after etcd restarted");
    drop(s);
    // A watchcache restart: the new cache's watch is opened while it loads etcd's history.
    // Linearizable reads then use revision probes on it, and leave no watcher behind
    // (kube-check found one leaked per restart).
    env.stop_server().await;
    let server = host_etcd::Server::start(env.cfg.clone()).await.expect("watchcache restarts");
    assert!(server.wait_ready(Duration::from_secs(10)).await, "ready again");
    env.server = Some(server);
    let mut cached = env.cached().await;
    let probes = env.server().metrics().upstream_requests("revision_probe");
    let t = Instant::now();
    while env.server().metrics().upstream_requests("revision_probe") < probes + 5 {
        assert!(t.elapsed() < Duration::from_secs(10), "reads do not use revision probes");
        let r = cached.get("/g/0", None).await.expect("get");
        assert_eq!(r.kvs().len(), 1);
    }
    assert_eq!(env.server().metrics().upstream_requests("quorum_read"), 1, "the list's only");
    let (a, b) = settle(&env).await;
    assert_eq!(a, b, "after a watchcache restart and linearizable reads");
    env.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_holds_at_most_max_cache_bytes() {
    let max = 64 << 10;
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.core.max_cache_bytes = Some(max);
    })
    .await;
    let mut direct = env.direct().await;
    let value = vec![b'v'; 1 << 10];
    let first = direct
        .put("/b/k0", value.clone(), None)
        .await
        .expect("put")
        .header()
        .expect("h")
        .revision();
    let mut last = first;
    for i in 1..200 {
        last = direct
            .put(format!("/b/k{}", i % 50), value.clone(), None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
    }
    env.wait_cache_rev(last).await;
    let bytes = env.cache_metric("watchcache_ring_bytes", "").await;
    assert!(bytes > 0.0 && bytes <= max as f64, "ring bytes {bytes} within {max}");
    assert!(env.cache_metric("watchcache_ring_byte_evictions_total", "").await > 100.0);
    // A watch from before the window still gets every event: etcd serves it.
    let mut cached = env.cached().await;
    let mut w = cached
        .watch("/b/", Some(WatchOptions::new().with_prefix().with_start_revision(first)))
        .await
        .expect("watch");
    let mut got = 0;
    while got < 200 {
        let m = tokio::time::timeout(Duration::from_secs(10), w.message())
            .await
            .expect("events")
            .expect("ok")
            .expect("msg");
        got += m.events().len();
    }
    assert_eq!(got, 200);
    assert!(env.server().metrics().watches().1 >= 1, "served by etcd");
    // A Kubernetes-style watch from there gets 410, counted.
    let r =
        support::http::get(format!("{}/kube/b/?watch=true&resourceVersion={first}", env.http()))
            .await
            .expect("kube watch");
    let text =
        tokio::time::timeout(Duration::from_secs(5), r.text()).await.expect("ends").expect("text");
    assert!(text.contains("\"code\":410"), "{text}");
    assert!(env.cache_metric("watchcache_watch_expired_total", "").await >= 1.0);
}

/// `delivery_coalesce`: an event after a quiet spell goes at once; events that follow a send
/// sooner than the hold are gathered and go together when it ends (whole revisions, in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_events_are_gathered_for_the_hold_and_a_lone_event_goes_at_once() {
    let hold = Duration::from_secs(1);
    let env = Env::start_with(EtcdOptions::default(), |c| c.cache.delivery_coalesce = hold).await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let mut stream =
        cached.watch("/co/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
    assert!(stream.message().await.expect("ok").expect("created").created());
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A lone event: no send for a while, so it goes at once.
    let t = Instant::now();
    let first = direct.put("/co/a", "0", None).await.expect("put").header().expect("h").revision();
    let r = stream.message().await.expect("ok").expect("response");
    let lone = t.elapsed();
    assert_eq!(
        r.events().iter().map(|e| e.kv().expect("kv").mod_revision()).collect::<Vec<_>>(),
        [first]
    );
    assert!(lone < hold * 7 / 10, "a lone event took {lone:?} (hold {hold:?})");
    // Ten revisions right after that send: held until the hold ends, then sent together.
    let mut revs = Vec::new();
    for i in 1..=10 {
        let h = direct.put(format!("/co/k{i}"), "v", None).await.expect("put");
        revs.push(h.header().expect("h").revision());
    }
    let mut got = Vec::new();
    let mut responses = 0;
    while got.len() < revs.len() {
        let r = stream.message().await.expect("ok").expect("response");
        responses += 1;
        got.extend(r.events().iter().map(|e| e.kv().expect("kv").mod_revision()));
    }
    assert_eq!(got, revs, "every revision once, in order");
    assert!(responses <= 2, "10 revisions within the hold came in {responses} responses");
    assert!(
        t.elapsed() >= hold * 8 / 10,
        "the gathered events came {:?} after the first",
        t.elapsed()
    );
}

/// etcd started with `--max-request-bytes=limit`, and watchcache told the same.
async fn with_request_limit(limit: usize) -> Env {
    let opts = EtcdOptions {
        extra_args: vec![format!("--max-request-bytes={limit}")],
        ..Default::default()
    };
    Env::start_with(opts, |cfg| cfg.cache.max_request_bytes = limit).await
}

/// Found in review: etcd sizes a RangeStream chunk as its `txn.Range` answered it, whose
/// count is what that Range read (the chunk's limit + 1 at most, `treeIndex.Range` without the
/// total), not every key left; watchcache counted every key left, which takes one more byte
/// once 128 or more are left. Here the first chunk is one byte under half etcd's limit with
/// etcd's count and at half with watchcache's old one, so etcd doubles the next chunk (20
/// keys) where watchcache kept 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_stream_chunks_are_sized_as_etcds_at_the_doubling_boundary() {
    use etcd_client::proto::{PbRangeResponse, PbResponseHeader};
    const LIMIT: usize = 64 << 10;
    let env = with_request_limit(LIMIT).await;
    let mut direct = env.direct().await;
    for i in 0..200 {
        direct.put(format!("/b/{i:03}"), "v", None).await.expect("put");
    }
    let (key, end) = (b"/b/".to_vec(), b"/b0".to_vec());
    // The first chunk as etcd's txn.Range answers it (10 keys, more, count 11), at the
    // revision of the stream's start; the first key's value grown until that is LIMIT/2 - 1.
    let first_chunk_size = |kvs: Vec<_>, rev: i64| {
        let header = Some(PbResponseHeader { revision: rev, ..Default::default() });
        let r = PbRangeResponse { header, kvs, more: true, count: 11 };
        prost::Message::encoded_len(&r)
    };
    let mut pad = 0usize;
    let rev = loop {
        let rev = env.etcd_rev().await;
        let req = PbRangeRequest {
            key: key.clone(),
            range_end: end.clone(),
            limit: 10,
            ..Default::default()
        };
        let r = support::raw_range(&env.etcd.endpoint(), tonic::Request::new(req))
            .await
            .expect("range");
        let size = first_chunk_size(r.kvs, rev);
        if size == LIMIT / 2 - 1 {
            break rev;
        }
        pad = (pad + LIMIT / 2 - 1).checked_sub(size).expect("below the size");
        direct.put("/b/000", vec![b'p'; pad], None).await.expect("put");
    };
    env.wait_cache_rev(rev).await;
    let req = PbRangeRequest { key, range_end: end, ..Default::default() };
    let sizes = |v: &[PbRangeStreamResponse]| {
        v.iter().map(|c| c.range_response.as_ref().map_or(0, |r| r.kvs.len())).collect::<Vec<_>>()
    };
    let want = range_stream(&env.etcd.endpoint(), &req).await.expect("etcd");
    let got = range_stream(&env.grpc(), &req).await.expect("watchcache");
    assert_eq!(sizes(&want)[..2], [10, 20], "etcd doubles after a chunk under half its limit");
    assert_eq!(sizes(&got), sizes(&want), "etcd's chunks");
    assert_eq!(got, want, "etcd's answer");
}

/// With etcd's `--max-request-bytes` given to watchcache too, a watch created with `fragment`
/// is cut where etcd cuts it and RangeStream's chunks are etcd's; a watchcache left at etcd's
/// default answers both differently (one response, fewer chunks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_request_bytes_sets_fragments_and_chunks_as_etcds() {
    const LIMIT: usize = 64 << 10;
    let env = with_request_limit(LIMIT).await;
    let default = host_etcd::Server::start(support::test_config(&env.etcd))
        .await
        .expect("a second watchcache, at etcd's default");
    assert!(default.wait_ready(Duration::from_secs(10)).await, "ready");
    let targets = [env.etcd.endpoint(), env.grpc(), default.grpc_addr().to_string()];
    let mut direct = env.direct().await;
    // Forty values of 20 KiB (each put below the limit)...
    let value = vec![b'm'; 20 << 10];
    for i in 0..40 {
        direct.put(format!("/m/{i:02}"), value.clone(), None).await.expect("put");
    }
    // ...read as a RangeStream (linearizable: each cache waits until it has them all)...
    let req =
        PbRangeRequest { key: b"/m/".to_vec(), range_end: b"/m0".to_vec(), ..Default::default() };
    let mut chunks = Vec::new();
    for t in &targets {
        let got = range_stream(t, &req).await.expect("RangeStream");
        let sizes: Vec<usize> =
            got.iter().map(|c| c.range_response.as_ref().map_or(0, |r| r.kvs.len())).collect();
        chunks.push(sizes);
    }
    assert!(chunks[0].len() > 1, "etcd's chunks at {LIMIT} bytes: {:?}", chunks[0]);
    assert_eq!(chunks[1], chunks[0], "watchcache with the same limit: etcd's chunks");
    assert_ne!(chunks[2], chunks[0], "watchcache at the default: not etcd's chunks");
    // ...then deleted in one revision, whose forty events with their previous values come to
    // 800 KiB: above the limit with etcd's 512 KiB allowance, below the default's 2 MiB.
    let del = direct
        .delete("/m/", Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .expect("delete");
    let rev = del.header().expect("h").revision();
    let mut shapes = Vec::new();
    for t in &targets {
        shapes.push(support::fragment_shapes(t, "/m/", "/m0", rev, 40).await);
    }
    let flags = |s: &[support::Shape]| s.iter().map(|r| r.0).collect::<Vec<_>>();
    eprintln!(
        "chunks {chunks:?}; fragment flags {:?}",
        shapes.iter().map(|s| flags(s)).collect::<Vec<_>>()
    );
    assert!(shapes[0].len() > 1, "etcd fragments: {:?}", flags(&shapes[0]));
    assert_eq!(shapes[1], shapes[0], "watchcache with the same limit: etcd's fragments");
    assert_eq!(flags(&shapes[2]), vec![false], "watchcache at the default: one response");
}
