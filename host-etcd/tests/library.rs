//! The library ([`host_etcd::Cache`]) against a real etcd, after the tables of etcd's own
//! integration tests for its Go `cache` package (spec/etcd.md 3.3), written from their
//! description: watches of a single key, ranges, prefixes and from-key at start revisions
//! before, at and after the current one, a transaction's revision, a latest-revision watcher;
//! progress (server-style and cache-wide) and progress notify; gets at chosen, latest and future
//! revisions, serializable and consistent; prefix scope; a lagging watcher; compaction.

use crate::support;

use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp};
use futures::StreamExt;
use host_etcd::{
    Cache, CacheConfig, EmbeddedEtcd, Error, EtcdOptions, GetOptions, Keys, WatchOptions,
};
use support::conformance::{ev_of, Ev};

/// The history every test starts from; returns the revision of the transaction and the last.
async fn history(c: &mut Client) -> (i64, i64) {
    // rev 2..=6
    for (k, v) in
        [("/foo/a", "1"), ("/foo/b", "2"), ("/foo/c", "3"), ("/bar/x", "4"), ("/foo/a", "5")]
    {
        c.put(k, v, None).await.expect("put");
    }
    c.delete("/foo/b", None).await.expect("delete"); // 7
    let txn = Txn::new().and_then(vec![
        TxnOp::put("/foo/d", "6", None),
        TxnOp::put("/foo/e", "7", None),
        TxnOp::delete("/foo/c", None),
    ]);
    let txn_rev = c.txn(txn).await.expect("txn").header().expect("h").revision(); // 8
    let mut last = 0;
    for (k, v) in [("/foo/f", "8"), ("/bar/y", "9"), ("/foo/a", "10"), ("/foo/g", "11")] {
        last = c.put(k, v, None).await.expect("put").header().expect("h").revision();
        // 9..=12
    }
    (txn_rev, last)
}

async fn setup(prefix: &str, config: CacheConfig) -> (EmbeddedEtcd, Client, Cache, i64, i64) {
    // As in etcd's tests, the cache starts first and sees the history happen.
    let etcd = EmbeddedEtcd::start(EtcdOptions::default()).await.expect("etcd");
    let mut client = support::connect(&etcd.endpoint(), None).await;
    let cache = Cache::with_config(client.clone(), prefix, config).await.expect("cache");
    cache.wait_ready(Duration::from_secs(10)).await.expect("ready");
    let (txn, last) = history(&mut client).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (cache.status().rv as i64) < last {
        assert!(std::time::Instant::now() < deadline, "cache behind");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (etcd, client, cache, txn, last)
}

/// etcd's events for `keys` from `start` through `until`, from etcd's own history.
async fn etcd_events(
    client: &mut Client,
    keys: &Keys,
    start: i64,
    until: i64,
    prev_kv: bool,
) -> Vec<Ev> {
    expected(&support::conformance::history(client, until).await, keys, start, until, prev_kv)
}

fn expected(history: &[Ev], keys: &Keys, start: i64, until: i64, prev_kv: bool) -> Vec<Ev> {
    let (k, end) = keys.etcd();
    history
        .iter()
        .filter(|e| {
            e.rev >= start && e.rev <= until && support::conformance::in_range(&e.key, &k, &end)
        })
        .map(|e| if prev_kv { e.clone() } else { Ev { prev: None, ..e.clone() } })
        .collect()
}

/// The cache's events through `until` (later ones that arrive with them are left out).
async fn cache_events(s: &mut host_etcd::WatchStream, until: i64) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::new();
    s.request_progress().await.expect("progress");
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("cache answers")
            .expect("open")
            .expect("ok");
        out.extend(m.events().iter().map(ev_of));
        let progress = m.events().is_empty() && m.header().is_some_and(|h| h.revision() >= until);
        if progress || out.last().is_some_and(|e| e.rev >= until) {
            break;
        }
    }
    out.retain(|e| e.rev <= until);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_match_etcd_for_keys_ranges_prefixes_and_start_revisions() {
    for prefix in ["", "/foo/"] {
        let (_etcd, mut client, cache, txn, last) = setup(prefix, CacheConfig::default()).await;
        let mut keys =
            vec![Keys::key("/foo/a"), Keys::range("/foo/b", "/foo/e"), Keys::prefix("/foo/")];
        if prefix.is_empty() {
            // From-key ranges reach past any prefix but the whole keyspace.
            keys.push(Keys::from_key("/foo/c"));
        }
        let mut starts = vec![4, 5, 6, txn, 10, 11, 12];
        starts.push(0);
        for k in &keys {
            for &start in &starts {
                let mut s = cache
                    .watch(k.clone(), WatchOptions::new().with_start_revision(start).with_prev_kv())
                    .await
                    .unwrap_or_else(|e| panic!("{prefix:?} {k:?} from {start}: {e}"));
                // A latest-revision watcher (start 0) sees the next write.
                let until = if start == 0 {
                    client
                        .put("/foo/z", "latest", None)
                        .await
                        .expect("put")
                        .header()
                        .expect("h")
                        .revision()
                } else {
                    last
                };
                let from = if start == 0 { until } else { start };
                eprintln!("case {prefix:?} {k:?} from {start} until {until}");
                let got = cache_events(&mut s, until).await;
                let want = etcd_events(&mut client, k, from, until, true).await;
                assert_eq!(got, want, "prefix {prefix:?}, {k:?} from {start}");
            }
        }
        // The transaction's events arrive in one response.
        let mut s = cache
            .watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(txn))
            .await
            .expect("watch");
        let first = s.next().await.expect("open").expect("ok");
        let of_txn = first
            .events()
            .iter()
            .filter(|e| e.kv().map(|kv| kv.mod_revision()) == Some(txn))
            .count();
        assert_eq!(of_txn, 3, "put, put, delete of one revision, in one response");
        // Keys outside the cache's prefix are refused clearly.
        if !prefix.is_empty() {
            let e =
                cache.watch(Keys::prefix("/bar/"), WatchOptions::new()).await.expect_err("outside");
            assert!(matches!(e, Error::OutsidePrefix { .. }), "{e}");
            let e = cache.get(Keys::key("/bar/x"), GetOptions::new()).await.expect_err("outside");
            assert!(e.to_string().contains("outside the cache's prefix"), "{e}");
            let e = cache
                .watch(Keys::from_key("/foo/"), WatchOptions::new())
                .await
                .expect_err("outside");
            assert!(matches!(e, Error::OutsidePrefix { .. }), "{e}");
        }
        cache.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_match_etcd_at_chosen_latest_and_future_revisions() {
    for prefix in ["", "/foo/"] {
        let (_etcd, mut client, cache, txn, last) = setup(prefix, CacheConfig::default()).await;
        let mut keys = vec![
            Keys::key("/foo/a"),
            Keys::key("/foo/nope"),
            Keys::range("/foo/b", "/foo/e"),
            Keys::prefix("/foo/"),
        ];
        if prefix.is_empty() {
            keys.push(Keys::from_key("/foo/c"));
            keys.push(Keys::prefix(""));
        }
        for k in &keys {
            for rev in [0, 5, txn, last, last + 10] {
                for serializable in [false, true] {
                    for limit in [0, 2] {
                        let mut o = GetOptions::new().with_revision(rev).with_limit(limit);
                        let (key, end) = k.etcd();
                        let mut e =
                            etcd_client::GetOptions::new().with_revision(rev).with_limit(limit);
                        if !end.is_empty() {
                            e = e.with_range(end);
                        }
                        if serializable {
                            o = o.with_serializable();
                            e = e.with_serializable();
                        }
                        let got = cache.get(k.clone(), o).await;
                        let want = client.get(key, Some(e)).await;
                        let name =
                            format!("{k:?} at {rev} serializable={serializable} limit={limit}");
                        match (got, want) {
                            (Ok(g), Ok(w)) => {
                                let kvs = |r: &etcd_client::GetResponse| {
                                    r.kvs()
                                        .iter()
                                        .map(|kv| {
                                            (
                                                kv.key().to_vec(),
                                                kv.value().to_vec(),
                                                kv.mod_revision(),
                                                kv.create_revision(),
                                                kv.version(),
                                            )
                                        })
                                        .collect::<Vec<_>>()
                                };
                                assert_eq!(kvs(&g), kvs(&w), "{name}");
                                assert_eq!((g.count(), g.more()), (w.count(), w.more()), "{name}");
                                assert_eq!(
                                    g.header().map(|h| h.revision()),
                                    w.header().map(|h| h.revision()),
                                    "{name}"
                                );
                            }
                            (Err(Error::Etcd(g)), Err(w)) => {
                                assert_eq!(g.to_string(), w.to_string(), "{name}")
                            }
                            (g, w) => panic!("{name}: cache {g:?}, etcd {w:?}"),
                        }
                    }
                }
            }
        }
        // Keys only and count only.
        let g = cache
            .get(Keys::prefix("/foo/"), GetOptions::new().with_keys_only())
            .await
            .expect("get");
        assert!(g.kvs().iter().all(|kv| kv.value().is_empty()) && !g.kvs().is_empty());
        let g = cache
            .get(Keys::prefix("/foo/"), GetOptions::new().with_count_only())
            .await
            .expect("get");
        assert!(g.kvs().is_empty() && g.count() > 0);
        // Consistent reads were answered from memory after a count-only quorum read each.
        assert!(cache.upstream_requests("quorum_read") > 0);
        cache.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_on_request_and_periodic_notify() {
    let config = CacheConfig {
        progress_notify_interval: Duration::from_millis(300),
        ..CacheConfig::default()
    };
    let (_etcd, mut client, cache, _txn, last) = setup("/foo/", config).await;
    let mut a = cache.watch(Keys::prefix("/foo/"), WatchOptions::new()).await.expect("watch");
    let mut b = cache.watch(Keys::key("/foo/a"), WatchOptions::new()).await.expect("watch");
    // Server-style: one stream asks.
    a.request_progress().await.expect("progress");
    let m = tokio::time::timeout(Duration::from_secs(3), a.next())
        .await
        .expect("answer")
        .expect("open")
        .expect("ok");
    assert!(m.events().is_empty());
    assert_eq!((m.watch_id(), m.header().map(|h| h.revision())), (-1, Some(last)));
    // Cache-wide: every stream gets one.
    let rev = client.put("/foo/h", "x", None).await.expect("put").header().expect("h").revision();
    let got = tokio::time::timeout(Duration::from_secs(3), a.next())
        .await
        .expect("event")
        .expect("open")
        .expect("ok");
    assert_eq!(got.events()[0].kv().map(|kv| kv.mod_revision()), Some(rev));
    cache.request_progress().await;
    for s in [&mut a, &mut b] {
        let m = tokio::time::timeout(Duration::from_secs(3), s.next())
            .await
            .expect("answer")
            .expect("open")
            .expect("ok");
        assert!(m.events().is_empty());
        assert_eq!(m.header().map(|h| h.revision()), Some(rev));
    }
    // Periodic notifications for an idle watch that asked for them.
    let mut n = cache
        .watch(Keys::prefix("/foo/"), WatchOptions::new().with_progress_notify())
        .await
        .expect("watch");
    let m = tokio::time::timeout(Duration::from_secs(3), n.next())
        .await
        .expect("notify")
        .expect("open")
        .expect("ok");
    assert!(m.events().is_empty());
    assert_eq!(m.watch_id(), n.watch_id());
    assert_eq!(m.header().map(|h| h.revision()), Some(rev));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_watcher_catches_up_from_history() {
    let config = CacheConfig { grpc_credit: 8, grpc_queue: 8, ..CacheConfig::default() };
    let (_etcd, mut client, cache, _txn, last) = setup("/foo/", config).await;
    let mut slow = cache
        .watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(last + 1))
        .await
        .expect("watch");
    let mut fast = cache
        .watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(last + 1))
        .await
        .expect("watch");
    let mut end = last;
    let mut fast_events = Vec::new();
    for i in 0..300 {
        end = client
            .put(format!("/foo/k{}", i % 20), format!("{i}"), None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
        if i % 50 == 49 {
            fast_events.extend(cache_events(&mut fast, end).await);
        }
    }
    let state = cache.debug_state().await;
    let lagging = state["watchers"]["listed"]
        .as_array()
        .expect("watchers")
        .iter()
        .filter(|w| w["state"] == "lagging")
        .count();
    assert_eq!(lagging, 1, "the unread watcher falls behind: {state}");
    let slow_events = cache_events(&mut slow, end).await;
    let want = etcd_events(&mut client, &Keys::prefix("/foo/"), last + 1, end, false).await;
    assert_eq!(slow_events, want);
    assert_eq!(fast_events, want);
    assert_eq!(cache.upstream_watches(), 1, "no watch went to etcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_compacted_start_revisions() {
    let mut config = CacheConfig::default();
    support::fixed_window(&mut config, 8);
    let (_etcd, mut client, cache, _txn, last) = setup("", config).await;
    for i in 0..20 {
        client.put(format!("/foo/n{i}"), "x", None).await.expect("put");
    }
    let end = client.put("/foo/end", "x", None).await.expect("put").header().expect("h").revision();
    // Older than the 8-event window: etcd serves it.
    let mut s = cache
        .watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(3))
        .await
        .expect("watch");
    let got = cache_events(&mut s, end).await;
    let want = etcd_events(&mut client, &Keys::prefix("/foo/"), 3, end, false).await;
    assert_eq!(got, want);
    assert!(cache.upstream_requests("watch") >= 2, "the old watch went to etcd");
    // Compacted: the stream ends with the compact revision.
    client.compact(last, None).await.expect("compact");
    let r = cache.watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(3)).await;
    let compacted = match r {
        Err(e) => e,
        Ok(mut s) => s.next().await.expect("an item").expect_err("compacted"),
    };
    match compacted {
        Error::Compacted { compact_revision } => assert_eq!(compact_revision, last),
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_run() {
    // cargo builds examples for `cargo test`; run them against their own embedded etcd.
    let exe = std::env::current_exe().expect("exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir").join("examples");
    for (name, expect) in [("config_watcher", "replicas = 5"), ("service_registry", "api-2 left")] {
        let path = dir.join(name);
        assert!(path.is_file(), "{} missing (cargo test builds the examples)", path.display());
        let out = tokio::process::Command::new(&path).output().await.expect("run example");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} failed: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(expect), "{name}: {text}");
    }
}

/// A library user who stops reading relayed watches (watches from before the cache's window,
/// which etcd serves) holds up neither the cache nor their own client's other calls: on etcd
/// each watch stream's unread responses stay within that stream's HTTP/2 window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_relayed_watches_hold_up_neither_the_cache_nor_other_calls() {
    let mut config = CacheConfig::default();
    support::fixed_window(&mut config, 8);
    let (_etcd, mut client, cache, _txn, _last) = setup("/foo/", config).await;
    for i in 0..10 {
        client.put(format!("/foo/old/{i}"), "x", None).await.expect("put");
    }
    // Four watches from before the cache's 8-event window (so etcd serves them), read up to
    // their `created` and then left.
    let mut unread = Vec::new();
    for _ in 0..4 {
        let s = cache
            .watch(Keys::prefix("/foo/"), WatchOptions::new().with_start_revision(3))
            .await
            .expect("watch");
        unread.push(s);
    }
    assert!(cache.upstream_requests("watch") >= 5, "the old watches went to etcd");
    // 25 MiB for each, one response per revision: more than the session's, the client's and
    // HTTP/2's windows take.
    let value = vec![b'v'; 256 << 10];
    for i in 0..100 {
        let put = client.put(format!("/foo/big/{i}"), value.clone(), None);
        tokio::time::timeout(Duration::from_secs(5), put)
            .await
            .expect("the client's own put within 5 s")
            .expect("put");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = client.get("/foo/", None).await.expect("get").header().expect("h").revision();
    let mut fresh = cache
        .watch(Keys::prefix("/foo/small/"), WatchOptions::new().with_start_revision(now + 1))
        .await
        .expect("watch");
    let put = tokio::time::timeout(Duration::from_secs(5), client.put("/foo/small/x", "1", None))
        .await
        .expect("the client's own put within 5 s")
        .expect("put");
    let rev = put.header().expect("h").revision();
    let got = tokio::time::timeout(Duration::from_secs(5), fresh.next())
        .await
        .expect("the cache's watcher gets the put within 5 s")
        .expect("open")
        .expect("ok");
    let revs: Vec<i64> =
        got.events().iter().filter_map(|e| e.kv()).map(|k| k.mod_revision()).collect();
    assert_eq!(revs, vec![rev]);
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        cache.get(Keys::key("/foo/small/x"), GetOptions::default()),
    )
    .await
    .expect("a consistent read from the cache within 5 s")
    .expect("get");
    assert_eq!(read.kvs().len(), 1);
    // Read again, each old watch gets etcd's events from revision 3 on, once each.
    let want = etcd_events(&mut client, &Keys::prefix("/foo/"), 3, rev, false).await;
    for (i, s) in unread.iter_mut().enumerate() {
        let got = cache_events(s, rev).await;
        assert_eq!(got.len(), want.len(), "watch {i}");
        assert!(got == want, "watch {i}: the events differ from etcd's");
    }
    assert!(cache.upstream_requests("watch") >= 9, "the unread watches paused their relays");
}

/// Seeded random readers of a library cache whose window is 16 events, so that most of their
/// watches start before it and are relayed over the client's own connection: readers stop
/// polling at random for longer than a relay waits (relays pause and are taken up again, or
/// move back onto the cache), while random writes come, a fifth of them 64–200 KiB. Every
/// watch must get etcd's events exactly: none lost, none repeated, in order, with previous
/// values when asked. `WATCHCACHE_TEST_SEED` replays seeds (`3`, `1-20`); 2 by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_library_readers_match_etcd() {
    for seed in crate::random_requests::seeds_or(2) {
        random_library_readers(seed).await;
    }
}

async fn random_library_readers(seed: u64) {
    use crate::random_requests::{keys, write, Rng};
    support::init_tracing();
    let mut rng = Rng::new(seed.wrapping_add(3000));
    let mut config = CacheConfig::default();
    support::fixed_window(&mut config, 16);
    config.rejoin_interval = Duration::from_millis(200);
    // Pauses often: readers stop for longer than this.
    config.relay_pause_after = Duration::from_millis(100);
    let (_etcd, mut client, cache, _txn, _last) = setup("", config).await;
    let ks: Vec<Vec<u8>> = keys().into_iter().filter(|k| k.starts_with(b"/q/")).collect();
    let pad = |rng: &mut Rng| {
        if rng.chance(20) {
            (64 << 10) + rng.below(136 << 10) as usize
        } else {
            rng.below(100) as usize
        }
    };
    let mut now = 0;
    for i in 0..60 {
        let p = pad(&mut rng);
        now = write(&mut client, &mut rng, &ks, 0, i, p).await;
    }
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let cache = std::sync::Arc::new(cache);
    let mut readers = Vec::new();
    let mut start_reader = |rng: &mut Rng, now: i64| {
        let keys = match rng.below(4) {
            0 => Keys::prefix("/q/k/"),
            1 => Keys::key(rng.pick(&ks).clone()),
            _ => Keys::prefix("/q/"),
        };
        // Anywhere in the history (mostly before the window), or just ahead of it.
        let start = if rng.chance(80) { 2 + rng.below(now as u64 - 1) as i64 } else { now + 1 };
        let prev_kv = rng.chance(30);
        let reader_seed = rng.below(u64::MAX);
        let cache = cache.clone();
        let mut done = done_rx.clone();
        let task = tokio::spawn(async move {
            let mut o = WatchOptions::new().with_start_revision(start);
            if prev_kv {
                o = o.with_prev_kv();
            }
            let mut s = cache.watch(keys.clone(), o).await.expect("watch");
            let mut rng = Rng::new(reader_seed);
            let (mut got, mut stalls) = (Vec::new(), 0);
            while !*done.borrow() {
                if rng.chance(10) {
                    // Not polled: longer than a relay waits for room.
                    stalls += 1;
                    tokio::time::sleep(Duration::from_millis(150 + rng.below(450))).await;
                }
                tokio::select! {
                    m = s.next() => match m {
                        Some(Ok(m)) => got.extend(m.events().iter().map(ev_of)),
                        other => panic!("seed {seed}: the watch ended: {other:?}"),
                    },
                    _ = done.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            (keys, start, prev_kv, s, got, stalls)
        });
        readers.push(task);
    };
    for _ in 0..6 {
        start_reader(&mut rng, now);
    }
    for i in 60..220 {
        let p = pad(&mut rng);
        now = write(&mut client, &mut rng, &ks, 0, i, p).await;
        if i == 140 {
            for _ in 0..2 {
                start_reader(&mut rng, now);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(12))).await;
    }
    let _ = done_tx.send(true);
    let history = support::conformance::history(&mut client, now).await;
    let (mut events, mut stalls) = (0, 0);
    for r in readers {
        let (keys, start, prev_kv, mut s, mut got, n) = r.await.expect("reader");
        got.extend(cache_events(&mut s, now).await);
        got.retain(|e| e.rev <= now);
        let want = expected(&history, &keys, start, now, prev_kv);
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "seed {seed}: {keys:?} from {start} (prev_kv {prev_kv}): {} events against \
                 etcd's {}, first difference at {first:?}: {:?} against {:?}",
                got.len(),
                want.len(),
                first.and_then(|i| got.get(i)).map(|e| e.rev),
                first.and_then(|i| want.get(i)).map(|e| e.rev),
            );
        }
        events += got.len();
        stalls += n;
    }
    eprintln!(
        "seed {seed}: 8 watches, {events} events, {stalls} stalls, {} etcd watches opened, \
         revision {now}",
        cache.upstream_requests("watch")
    );
}
