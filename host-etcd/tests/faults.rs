//! Faults, against a real etcd: etcd killed and restarted under load, compaction under load, a
//! client that stops reading, 1 000 concurrent watchers. Every recorded stream goes through the
//! conformance checker: each watcher receives every event or sees its watch end explicitly.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, WatchOptions, WatchStream};
use host_etcd::EtcdOptions;
use support::conformance::{check, collect, history, Recorded};
use support::Env;

async fn open(
    client: &mut Client,
    name: String,
    prefix: &str,
    start: i64,
) -> (WatchStream, Recorded) {
    let mut s = client
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(start).with_prev_key()),
        )
        .await
        .expect("watch");
    let mut rec = Recorded {
        name,
        key: prefix.as_bytes().to_vec(),
        range_end: cacher_core::prefix_end(prefix.as_bytes()).expect("end"),
        start_rev: start,
        ..Default::default()
    };
    let m = s.message().await.expect("created").expect("created");
    let r = support::conformance::resp_of(&m);
    assert!(r.created, "{r:?}");
    rec.created_rev = r.header_rev;
    rec.responses.push(r);
    (s, rec)
}

/// Puts to etcd directly until stopped, tolerating etcd being down; returns the last revision.
fn writer(
    endpoint: String,
    prefix: &'static str,
    every: Duration,
    value_size: usize,
    stop: Arc<AtomicBool>,
    last: Arc<AtomicI64>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut n = 0u64;
        let mut client: Option<Client> = None;
        while !stop.load(Ordering::Relaxed) {
            if client.is_none() {
                client = Client::connect([endpoint.as_str()], None).await.ok();
            }
            if let Some(c) = client.as_mut() {
                let put = tokio::time::timeout(
                    Duration::from_millis(500),
                    c.put(
                        format!("{prefix}{}", n % 50),
                        {
                            let mut v = format!("v{n}").into_bytes();
                            v.resize(value_size.max(v.len()), b'.');
                            v
                        },
                        None,
                    ),
                )
                .await;
                match put {
                    Ok(Ok(r)) => {
                        n += 1;
                        last.fetch_max(r.header().map_or(0, |h| h.revision()), Ordering::Relaxed);
                    }
                    _ => client = None,
                }
            }
            tokio::time::sleep(every).await;
        }
        n
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_and_restarted_under_load() {
    support::init_tracing();
    let mut env = Env::start().await;
    let mut cached = env.cached().await;
    let start = env.etcd_rev().await + 1;
    let mut watches = Vec::new();
    for i in 0..30 {
        watches.push(open(&mut cached, format!("w{i}"), "/f/", start).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicI64::new(0));
    let w = writer(
        env.etcd.endpoint(),
        "/f/",
        Duration::from_millis(5),
        16,
        stop.clone(),
        last.clone(),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    env.etcd.kill().await;
    let before_kill = last.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.etcd.restart(EtcdOptions::default()).await.expect("restart etcd");
    let back = Instant::now();
    // The cache catches up with etcd's new writes within 5 s of its return.
    let mut caught_up = None;
    while back.elapsed() < Duration::from_secs(10) {
        let l = last.load(Ordering::Relaxed);
        let st = env.server().caches()[0].status();
        if l > before_kill && st.ready && st.rv as i64 >= l {
            caught_up = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caught_up = caught_up.expect("the cache did not catch up with etcd within 10 s");
    assert!(
        caught_up < Duration::from_secs(5),
        "ready and current {caught_up:?} after etcd's return"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    let written = w.await.expect("writer");
    let end = env.etcd_rev().await;
    let mut direct = env.direct().await;
    let hist = history(&mut direct, end).await;
    let mut violations = Vec::new();
    let mut complete = 0;
    for (s, rec) in &mut watches {
        let _ = s.request_progress().await;
        collect(s, rec, end, Duration::from_secs(15)).await;
        if rec.last_rev() >= end {
            complete += 1;
        } else {
            assert!(
                rec.error.is_some() || rec.canceled().is_some(),
                "{}: neither complete nor ended (at {} of {end})",
                rec.name,
                rec.last_rev()
            );
        }
        violations.extend(check(&hist, rec));
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    assert_eq!(complete, watches.len(), "every watcher got every event ({written} writes)");
    eprintln!("etcd restart: {written} writes, cache current {caught_up:?} after etcd's return, {complete} watchers complete");
    env.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_under_load() {
    support::init_tracing();
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.core.capacity = 200;
        cfg.cache.core.lower_bound_capacity = 200;
        cfg.cache.core.upper_bound_capacity = 200;
        cfg.cache.core.dynamic_capacity = false;
        cfg.cache.grpc_credit = 16;
        cfg.cache.grpc_queue = 16;
    })
    .await;
    let mut cached = env.cached().await;
    let direct = env.direct().await;
    // The whole history, recorded before any compaction.
    // (Read all along: etcd itself cancels a watcher that falls behind a compaction.)
    let mut truth = support::conformance::history_stream(&direct).await;
    let truth_until = Arc::new(AtomicI64::new(i64::MAX));
    let truth_task = {
        let until = truth_until.clone();
        tokio::spawn(async move {
            let mut rec = Recorded {
                name: "truth".into(),
                key: vec![0],
                range_end: vec![0],
                start_rev: 1,
                ..Default::default()
            };
            while rec.last_rev() < until.load(Ordering::Relaxed)
                && rec.error.is_none()
                && rec.canceled().is_none()
            {
                collect(
                    &mut truth,
                    &mut rec,
                    until.load(Ordering::Relaxed),
                    Duration::from_millis(100),
                )
                .await;
            }
            rec
        })
    };
    let start = env.etcd_rev().await + 1;
    // Ten fast readers, each reading all along in a task of its own until told where the
    // history ends. (They share one connection, so a stream left unread while another is read
    // would hold the connection's HTTP/2 window with its backlog.)
    let fast_until = Arc::new(AtomicI64::new(i64::MAX));
    let mut fast = Vec::new();
    for i in 0..10 {
        let (mut s, mut rec) = open(&mut cached, format!("fast{i}"), "/c/", start).await;
        let until = fast_until.clone();
        fast.push(tokio::spawn(async move {
            let mut asked = false;
            loop {
                let u = until.load(Ordering::Relaxed);
                if rec.last_rev() >= u || rec.canceled().is_some() || rec.error.is_some() {
                    break;
                }
                if u != i64::MAX && !asked {
                    let _ = s.request_progress().await;
                    asked = true;
                }
                collect(&mut s, &mut rec, u, Duration::from_millis(100)).await;
            }
            rec
        }));
    }
    // A slow reader (16 KiB values fill its buffers): it falls behind the 200-event
    // window, then etcd has compacted its revision.
    // (On its own connection: a stream nobody reads holds its connection's HTTP/2 window.)
    let mut slow_client = env.cached().await;
    let mut slow = open(&mut slow_client, "slow".into(), "/c/", start).await;
    let mut admin = env.cached().await;
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicI64::new(0));
    let w = writer(
        env.etcd.endpoint(),
        "/c/",
        Duration::from_millis(1),
        4096,
        stop.clone(),
        last.clone(),
    );
    let mut compactions = 0;
    // 1 000 revisions (five times the window), compacting as they come.
    let t0 = Instant::now();
    while last.load(Ordering::Relaxed) < start + 1000 {
        assert!(t0.elapsed() < Duration::from_secs(60), "writes too slow");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rev = last.load(Ordering::Relaxed);
        if rev > 50 {
            admin.compact(rev - 30, None).await.expect("compact");
            compactions += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = w.await.expect("writer");
    let end = env.etcd_rev().await;
    truth_until.store(end, Ordering::Relaxed);
    let truth_rec = tokio::time::timeout(Duration::from_secs(15), truth_task)
        .await
        .expect("truth in time")
        .expect("truth");
    assert!(
        truth_rec.canceled().is_none() && truth_rec.last_rev() >= end,
        "etcd's own history watch: {:?}",
        truth_rec.error
    );
    let hist: Vec<_> = truth_rec.events().cloned().collect();
    let mut violations = Vec::new();
    fast_until.store(end, Ordering::Relaxed);
    let fast = tokio::time::timeout(Duration::from_secs(15), futures::future::join_all(fast))
        .await
        .expect("the fast readers reach the end in time");
    for rec in fast {
        let rec = rec.expect("fast reader");
        assert!(
            rec.last_rev() >= end,
            "{}: incomplete at {} of {end} (canceled: {:?}, error: {:?})",
            rec.name,
            rec.last_rev(),
            rec.canceled(),
            rec.error
        );
        violations.extend(check(&hist, &rec));
    }
    let (s, rec) = &mut slow;
    collect(s, rec, end, Duration::from_secs(15)).await;
    let canceled = rec.canceled().cloned();
    let c = canceled.expect("the slow watcher fell out of the window and past etcd's compaction");
    assert!(c.compact_rev > 0, "the slow watcher ends with etcd's compact revision: {c:?}");
    violations.extend(check(&hist, rec));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    eprintln!("compaction under load: {written} writes, {compactions} compactions, slow watcher canceled: {}", slow.1.canceled().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_costs_bounded_memory_and_slows_no_one() {
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.grpc_credit = 64;
        cfg.cache.grpc_queue = 128;
    })
    .await;
    let mut stalled_client = env.cached().await;
    let start = env.etcd_rev().await + 1;
    let (mut stalled, mut stalled_rec) =
        open(&mut stalled_client, "stalled".into(), "/s/", start).await;
    // Readers on their own connections read continuously and time every event.
    let n = 4000usize;
    let mut readers = Vec::new();
    for i in 0..5 {
        let mut c = env.cached().await;
        let (mut s, mut rec) = open(&mut c, format!("reader{i}"), "/s/", start).await;
        readers.push(tokio::spawn(async move {
            let _c = c;
            let mut worst = Duration::ZERO;
            while rec.events().count() < n && rec.error.is_none() {
                match tokio::time::timeout(Duration::from_secs(20), s.message()).await {
                    Ok(Ok(Some(m))) => {
                        for e in m.events() {
                            let sent: u128 =
                                std::str::from_utf8(&e.kv().expect("kv").value()[..20])
                                    .expect("utf8")
                                    .trim()
                                    .parse()
                                    .expect("time");
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .expect("clock")
                                .as_micros();
                            worst =
                                worst.max(Duration::from_micros(now.saturating_sub(sent) as u64));
                        }
                        rec.responses.push(support::conformance::resp_of(&m));
                    }
                    other => rec.error = Some(format!("{other:?}")),
                }
            }
            (rec, worst)
        }));
    }
    // 4 000 events of 4 KiB: 16 MiB the stalled client never reads while the others do.
    let mut direct = env.direct().await;
    for i in 0..n {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_micros();
        let mut value = format!("{now:>20}").into_bytes();
        value.resize(4096, b'v');
        direct.put(format!("/s/{}", i % 100), value, None).await.expect("put");
    }
    let end = env.etcd_rev().await;
    env.wait_cache_rev(end).await;
    let hist = history(&mut direct, end).await;
    for r in readers {
        let (rec, worst) = r.await.expect("reader");
        assert!(
            rec.last_rev() >= end,
            "{} fell behind: at {} of {end}: {:?}",
            rec.name,
            rec.last_rev(),
            rec.error
        );
        let v = check(&hist, &rec);
        assert!(v.is_empty(), "{v:?}");
        assert!(worst < Duration::from_secs(1), "{}: worst put-to-receive {worst:?}", rec.name);
    }
    // The stalled watcher is held as a position in the ring, not as a copy of the events.
    let state: serde_json::Value = support::http::get(format!("{}/debug/state", env.http()))
        .await
        .expect("state")
        .json()
        .await
        .expect("json");
    let watchers = state["caches"][0]["watchers"]["listed"].as_array().expect("watchers").clone();
    let lagging: Vec<_> = watchers.iter().filter(|w| w["state"] == "lagging").collect();
    assert_eq!(lagging.len(), 1, "one lagging watcher: {watchers:?}");
    assert!(lagging[0]["queued"].as_u64().expect("queued") <= 128, "{:?}", lagging[0]);
    // When it reads again, it gets everything, replayed from the ring.
    collect(&mut stalled, &mut stalled_rec, end, Duration::from_secs(30)).await;
    let v = check(&hist, &stalled_rec);
    assert!(v.is_empty(), "{v:?}");
    assert!(stalled_rec.last_rev() >= end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_watchers() {
    let env = Env::start().await;
    let start = env.etcd_rev().await + 1;
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(env.cached().await);
    }
    let t = Instant::now();
    let mut watches = Vec::new();
    for i in 0..1000 {
        let c = &mut clients[i % 10];
        watches.push(open(c, format!("w{i}"), "/k/", start).await);
    }
    let opened = t.elapsed();
    assert_eq!(env.cache_metric("watchcache_grpc_watchers", "").await, 1000.0);
    assert_eq!(
        env.etcd_metric("etcd_debugging_mvcc_watcher_total", "").await,
        1.0,
        "one upstream watch for 1 000 watchers"
    );
    let mut direct = env.direct().await;
    for i in 0..100 {
        direct.put(format!("/k/{}", i % 10), format!("{i}"), None).await.expect("put");
    }
    let end = env.etcd_rev().await;
    let hist = history(&mut direct, end).await;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (mut s, mut rec) in watches {
        let hist = hist.clone();
        tasks.push(tokio::spawn(async move {
            collect(&mut s, &mut rec, end, Duration::from_secs(30)).await;
            (rec.last_rev() >= end, check(&hist, &rec))
        }));
    }
    let mut complete = 0;
    let mut violations = Vec::new();
    for t in tasks {
        let (ok, v) = t.await.expect("task");
        complete += usize::from(ok);
        violations.extend(v);
    }
    assert!(
        violations.is_empty(),
        "{}",
        violations.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(complete, 1000);
    eprintln!(
        "1000 watchers: opened in {opened:?}, 100 revisions delivered to all in {:?}",
        t.elapsed()
    );
}
