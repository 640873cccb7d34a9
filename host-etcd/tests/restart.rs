//! A restart of watchcache without a storm on etcd: the new cache loads etcd's recent history
//! into its window before serving (`ReflectorOptions::backfill_revisions`), so watchers
//! resuming from the revisions they had reached are served from memory — each event once, and
//! no watch of theirs reaches etcd. With the backfill off (Kubernetes' behaviour), every
//! resuming watcher goes to etcd.

use crate::support;

use std::time::Duration;

use etcd_client::WatchOptions;
use host_etcd::{EtcdOptions, Server};
use support::conformance::{check, collect, history, Recorded};
use support::{put, Env};

const WATCHERS: usize = 40;

async fn restart_with(backfill: u64) -> (usize, f64) {
    let mut env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.reflector.backfill_revisions = backfill;
        // etcd's answer to the list at the window's start says it still has that revision:
        // good for as long as any probe's answer (long here, so that the count below does not
        // depend on how fast the watchers come back).
        cfg.cache.reflector.compaction_probe = Duration::from_secs(30);
    })
    .await;
    let mut direct = env.direct().await;
    let mut last = 0;
    for i in 0..300 {
        last = put(&mut direct, format!("/r/k{}", i % 30), format!("v{i}")).await;
    }
    env.wait_cache_rev(last).await;
    // Each watcher had reached some revision of the last 200 when the cache went away.
    let resume_from: Vec<i64> = (0..WATCHERS).map(|i| last - 200 + (i as i64 * 5) + 1).collect();
    env.stop_server().await;
    for i in 0..20 {
        last = put(&mut direct, format!("/r/k{i}"), "after").await;
    }
    let before = env.etcd_metric("etcd_debugging_mvcc_watch_stream_total", "").await;
    let server = Server::start(env.cfg.clone()).await.expect("restart");
    assert!(server.wait_ready(Duration::from_secs(20)).await);
    env.server = Some(server);
    let mut cached = env.cached().await;
    let mut recs = Vec::new();
    for (i, from) in resume_from.iter().enumerate() {
        let mut s = cached
            .watch("/r/", Some(WatchOptions::new().with_prefix().with_start_revision(*from)))
            .await
            .expect("watch");
        let mut rec = Recorded {
            name: format!("w{i}"),
            key: b"/r/".to_vec(),
            range_end: b"/r0".to_vec(),
            start_rev: *from,
            ..Default::default()
        };
        collect(&mut s, &mut rec, last, Duration::from_secs(20)).await;
        recs.push((s, rec));
    }
    let hist = history(&mut direct, last).await;
    let mut violations = Vec::new();
    for (_, rec) in &recs {
        assert!(rec.last_rev() >= last, "{} stuck at {}", rec.name, rec.last_rev());
        violations.extend(check(&hist, rec));
    }
    assert!(violations.is_empty(), "{violations:?}");
    let streams = env.etcd_metric("etcd_debugging_mvcc_watch_stream_total", "").await - before;
    let relayed = env.server().metrics().watches().1 as usize;
    if backfill > 0 {
        // What the restart cost etcd: one list (one page here), one watch (the history watch
        // goes on as the live one), one read of the current revision, and no compaction probe:
        // the list at the window's start was etcd's answer that it still has that revision.
        let m = env.server().metrics();
        let asked = ["list", "watch", "quorum_read", "compaction_probe"]
            .map(|k| (k, m.upstream_requests(k)));
        assert_eq!(asked, [("list", 1), ("watch", 1), ("quorum_read", 1), ("compaction_probe", 0)]);
    }
    drop(recs);
    (relayed, streams)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_cache_serves_resuming_watchers_from_etcds_history() {
    let (relayed, _) = restart_with(10_000).await;
    assert_eq!(relayed, 0, "every resuming watcher is served from the backfilled window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_backfill_every_resuming_watcher_goes_to_etcd() {
    let (relayed, _) = restart_with(0).await;
    assert_eq!(relayed, WATCHERS, "Kubernetes' behaviour: the new window starts at the list");
}

/// A restart after etcd was compacted inside the backfill's reach: etcd's cancel of the history
/// watch names the compaction revision C, and the new window starts there. The cache then
/// answers as etcd at every revision from C on (Ranges at past revisions, a watch from C + 1,
/// each event once, none of it from etcd), and below C etcd's own ErrCompacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_compaction_starts_the_window_at_it() {
    let mut env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.reflector.backfill_revisions = 10_000;
    })
    .await;
    let mut direct = env.direct().await;
    let mut last = 0;
    for i in 0..200 {
        last = put(&mut direct, format!("/c/k{}", i % 20), format!("v{i}")).await;
    }
    let compacted = last - 50;
    env.stop_server().await;
    direct
        .compact(compacted, Some(etcd_client::CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    for i in 0..10 {
        last = put(&mut direct, format!("/c/k{i}"), "after").await;
    }
    let server = Server::start(env.cfg.clone()).await.expect("restart");
    assert!(server.wait_ready(Duration::from_secs(20)).await);
    env.server = Some(server);
    let mut cached = env.cached().await;
    let prefix = |rev: i64| Some(etcd_client::GetOptions::new().with_prefix().with_revision(rev));
    for rev in [compacted, compacted + 1, compacted + 25, last - 1, last] {
        let want = direct.get("/c/", prefix(rev)).await.expect("etcd's range");
        let got = cached.get("/c/", prefix(rev)).await.expect("watchcache's range");
        let kvs = |r: &etcd_client::GetResponse| {
            let kvs: Vec<_> = r
                .kvs()
                .iter()
                .map(|kv| {
                    let v = (kv.key().to_vec(), kv.value().to_vec(), kv.version(), kv.lease());
                    (v, kv.create_revision(), kv.mod_revision())
                })
                .collect();
            (kvs, r.count())
        };
        assert_eq!(kvs(&got), kvs(&want), "at {rev}");
    }
    let below = cached.get("/c/", prefix(compacted - 1)).await.map(|_| ());
    assert!(
        matches!(&below, Err(e) if e.to_string().contains("required revision has been compacted")),
        "{below:?}"
    );
    let from = compacted + 1;
    let mut s = cached
        .watch("/c/", Some(WatchOptions::new().with_prefix().with_start_revision(from)))
        .await
        .expect("watch");
    let mut rec = Recorded {
        name: "from the compaction".into(),
        key: b"/c/".to_vec(),
        range_end: b"/c0".to_vec(),
        start_rev: from,
        ..Default::default()
    };
    collect(&mut s, &mut rec, last, Duration::from_secs(20)).await;
    assert!(rec.last_rev() >= last, "stuck at {}", rec.last_rev());
    let hist = support::conformance::history_from(&mut direct, from, last).await;
    let violations = check(&hist, &rec);
    assert!(violations.is_empty(), "{violations:?}");
    let m = env.server().metrics();
    assert_eq!(m.watches().1, 0, "the watch from the compaction is served from memory");
    // The history watch canceled at S = 1, then one from C + 1: two watches, one list.
    assert_eq!((m.upstream_requests("list"), m.upstream_requests("watch")), (1, 2));
}

/// A watchcache started while etcd is down (started beside it, or restarted during an outage)
/// waits for etcd instead of exiting, and serves once etcd answers; with a start timeout it
/// gives up with etcd's error after that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_while_etcd_is_down_waits_for_etcd() {
    let mut etcd = host_etcd::EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let last = put(&mut support::connect(&etcd.endpoint(), None).await, "/w/1", "one").await;
    etcd.kill().await;
    let mut cfg = support::test_config(&etcd);

    cfg.etcd_start_timeout = Some(Duration::from_millis(700));
    let t = std::time::Instant::now();
    let gave_up = Server::start(cfg.clone()).await.map(|_| ());
    assert!(matches!(&gave_up, Err(e) if e.contains("etcd")), "{gave_up:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "gave up after {:?}", t.elapsed());

    cfg.etcd_start_timeout = None;
    let starting = tokio::spawn(Server::start(cfg));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!starting.is_finished(), "the start waits while etcd is down");
    etcd.restart(EtcdOptions::default()).await.expect("etcd restarts");
    let server = tokio::time::timeout(Duration::from_secs(20), starting)
        .await
        .expect("started within 20 s of etcd's return")
        .expect("task")
        .expect("started");
    assert!(server.wait_ready(Duration::from_secs(10)).await, "cache not ready");
    let mut cached = support::connect(&server.grpc_addr().to_string(), None).await;
    let got = cached.get("/w/1", None).await.expect("get");
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"one"[..]));
    assert!(got.header().expect("header").revision() >= last);
    server.shutdown().await;
}
