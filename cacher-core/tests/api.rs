//! The Cacher API directly: metrics, timers and their reasons, credit, bookmark buckets, bad
//! storage input leaving the state unchanged.

use cacher_core::{
    Attrs, Cacher, CloseCause, Config, ConsumeMode, FieldSelector, GetRequest, Key, KeyRange,
    ListRequest, Object, Output, ReadOutcome, RequestId, RvParam, SlowPolicy, StorageError,
    TimerReason, Timestamp, WatchEvent, WatchRequest, WatcherState, WatcherSummary,
};

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn pod(name: &str, rv: u64, node: &str) -> Object {
    Object::new(format!("/pods/ns/{name}").as_bytes(), Some(b"v"), rv).with_attrs(Attrs::new(
        [("app", "web")],
        [("metadata.namespace", "ns"), ("metadata.name", name), ("spec.nodeName", node)],
    ))
}

fn drain(c: &mut Cacher) -> Vec<Output> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

fn ready(cfg: Config) -> Cacher {
    let mut c = Cacher::new(cfg, t(0)).unwrap();
    c.handle_replace(t(0), 10, vec![pod("a", 5, "n1"), pod("b", 6, "n2")]).unwrap();
    drain(&mut c);
    c
}

#[test]
fn read_wait_histogram_counts_waits_for_rv_above_zero_only() {
    // TestHistogramCacheReadWait.
    let mut c = ready(Config::default());
    c.get(t(0), GetRequest { key: Key::from("/pods/ns/a"), rv: RvParam::Zero }).unwrap();
    assert_eq!(c.metrics().read_wait_buckets[13], 0);
    c.get(t(0), GetRequest { key: Key::from("/pods/ns/a"), rv: RvParam::At(12) }).unwrap();
    c.handle_put(t(30), pod("c", 12, "n1")).unwrap();
    let outs = drain(&mut c);
    assert!(outs.iter().any(|o| matches!(o, Output::Get { outcome: ReadOutcome::Cache(_), .. })));
    let m = c.metrics();
    // Waited 30 ms: not in the 5 and 25 ms buckets, in every bucket from 50 ms on.
    assert_eq!(&m.read_wait_buckets[..3], &[0, 0, 1]);
    assert!(m.read_wait_buckets[3..].iter().all(|&n| n == 1));
    assert_eq!(m.read_wait_sum_ms, 30);
}

#[test]
fn lists_by_trigger_value_use_the_index() {
    // TestWaitUntilFreshAndList: an exact match on the indexed field picks the index.
    let cfg = Config { index_field: Some("spec.nodeName".into()), ..Config::default() };
    let mut c = ready(cfg);
    let mut req = ListRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::Zero);
    req.selector.fields = FieldSelector::parse("spec.nodeName=n2").unwrap();
    c.list(t(1), req).unwrap();
    let items = match drain(&mut c).pop() {
        Some(Output::List { outcome: ReadOutcome::Cache(r), .. }) => r.items,
        other => panic!("{other:?}"),
    };
    assert_eq!(items.len(), 1);
    assert_eq!(c.metrics().cache_lists.get("f:spec.nodeName"), Some(&1));
    assert_eq!(c.metrics().cache_list_fetched.get("f:spec.nodeName"), Some(&1));
}

#[test]
fn poll_timeout_says_why() {
    let mut c = ready(Config { dispatch_tick_jitter: 0.0, ..Config::default() });
    assert_eq!(c.poll_timeout(), Some((t(1000), TimerReason::DispatchTick)));
    let mut w = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(10));
    w.timeout_ms = Some(500);
    let id = c.start_watch(t(100), w).unwrap();
    assert_eq!(c.poll_timeout(), Some((t(600), TimerReason::WatchDeadline)));
    c.get(t(200), GetRequest { key: Key::from("/pods/ns/a"), rv: RvParam::At(99) }).unwrap();
    assert_eq!(c.poll_timeout(), Some((t(600), TimerReason::WatchDeadline)));
    // Early calls do nothing.
    c.handle_timeout(t(599));
    assert!(c.watcher(id).is_some());
    c.handle_timeout(t(600));
    let outs = drain(&mut c);
    assert!(outs
        .iter()
        .any(|o| matches!(o, Output::WatchClosed { cause: CloseCause::Timeout, .. })));
    assert_eq!(c.poll_timeout(), Some((t(1000), TimerReason::DispatchTick)));
    c.handle_timeout(t(1000));
    assert_eq!(c.poll_timeout(), Some((t(2000), TimerReason::DispatchTick)));
    c.handle_timeout(t(3200));
    let outs = drain(&mut c);
    assert!(matches!(outs.last(), Some(Output::Rejected { status, .. }) if status.code() == 504));
}

#[test]
fn credit_lets_events_through_then_they_queue() {
    let mut c = ready(Config::default());
    let mut w = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(10));
    w.consume = ConsumeMode::Manual;
    let id = c.start_watch(t(0), w).unwrap();
    drain(&mut c);
    assert_eq!(c.grant_credit(t(0), id, 2), 0);
    for rv in 11..=14 {
        c.handle_put(t(1), pod("a", rv, "n1")).unwrap();
    }
    let direct: usize = drain(&mut c)
        .iter()
        .map(|o| match o {
            Output::Fanout { targets, .. } => targets.iter().filter(|t| t.watch == id).count(),
            _ => 0,
        })
        .sum();
    assert_eq!(direct, 2);
    assert_eq!(c.watcher(id).unwrap().queued, 2);
    assert_eq!(c.grant_credit(t(2), id, 5), 2);
    let delivered: Vec<u64> = drain(&mut c)
        .into_iter()
        .flat_map(|o| match o {
            Output::Deliver { events, .. } => events.iter().map(WatchEvent::rv).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(delivered, [13, 14]);
    // Three credits left: the next event goes straight through.
    c.handle_put(t(3), pod("a", 15, "n1")).unwrap();
    assert!(drain(&mut c).iter().any(|o| matches!(o, Output::Fanout { .. })));
}

#[test]
fn bookmark_buckets_do_not_leak_with_watcher_churn() {
    // TestCacherNoLeakWithMultipleWatchers.
    let mut c = ready(Config {
        bookmark_frequency_ms: 1000,
        dispatch_tick_jitter: 0.0,
        ..Config::default()
    });
    let mut now = 0;
    for i in 0..200u64 {
        now += 10;
        let mut w = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(10));
        w.allow_bookmarks = true;
        let id = c.start_watch(t(now), w).unwrap();
        if i % 2 == 0 {
            c.stop_watch(t(now), id);
        }
        c.handle_timeout(t(now));
        drain(&mut c);
    }
    let open: Vec<RequestId> = c.watchers().iter().map(|w| w.id).collect();
    for id in open {
        c.stop_watch(t(now), id);
    }
    c.handle_timeout(t(now + 5000));
    drain(&mut c);
    assert_eq!(c.watcher_count(), 0);
    assert_eq!(c.bookmark_bucket_entries(), 0);
}

#[test]
fn bad_storage_input_changes_nothing() {
    let mut c = ready(Config::default());
    let before = (c.resource_version(), c.store_len(), c.window());
    assert_eq!(
        c.handle_put(t(1), pod("x", 9, "n1")),
        Err(StorageError::RvWentBack { rv: 9, current: 10 })
    );
    assert!(matches!(c.handle_delete(t(1), b"/pods/ns/zzz", 11), Err(StorageError::UnknownKey(_))));
    assert!(matches!(
        c.handle_revision(
            t(1),
            11,
            vec![
                cacher_core::Change::Put(pod("a", 11, "n1")),
                cacher_core::Change::Put(pod("a", 11, "n1"))
            ]
        ),
        Err(StorageError::DuplicateKey(_))
    ));
    assert!(matches!(c.handle_progress(t(1), 3), Err(StorageError::RvWentBack { .. })));
    assert_eq!((c.resource_version(), c.store_len(), c.window()), before);
    assert!(drain(&mut c).is_empty());
    c.check_invariants();
}

#[test]
fn a_relist_during_a_freshness_wait_closes_the_watch_and_stop_works_while_waiting() {
    let mut c = ready(Config { watch_list: true, ..Config::default() });
    let mut w = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(20));
    w.send_initial_events = Some(true);
    let a = c.start_watch(t(0), w.clone()).unwrap();
    let b = c.start_watch(t(0), w).unwrap();
    assert_eq!(c.parked_count(), 2);
    assert!(c.stop_watch(t(1), b));
    let outs = drain(&mut c);
    assert!(
        matches!(outs.as_slice(), [Output::WatchClosed { watch, cause: CloseCause::Stopped, .. }] if *watch == b)
    );
    c.handle_storage_error(t(2), "broken");
    c.handle_replace(t(3), 25, vec![]).unwrap();
    let outs = drain(&mut c);
    assert!(outs.iter().any(|o| matches!(o, Output::WatchClosed { watch, cause: CloseCause::Reinitializing, .. } if *watch == a)));
    assert_eq!(c.parked_count(), 0);
}

#[test]
fn config_errors_name_the_field() {
    let e =
        Cacher::new(Config { bookmark_frequency_ms: 0, ..Config::default() }, t(0)).err().unwrap();
    assert_eq!(e.field, "bookmark_frequency_ms");
}

#[test]
fn the_watcher_summary_counts_what_watchers_describes() {
    let mut c = ready(Config::default());
    assert_eq!(c.watcher_summary(), WatcherSummary::default());
    let mut slow = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(10));
    slow.consume = ConsumeMode::Manual;
    slow.slow_policy = SlowPolicy::Lag;
    slow.queue_capacity = Some(2);
    let slow = c.start_watch(t(1), slow).unwrap();
    c.start_watch(t(1), WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(10)))
        .unwrap();
    for rv in 11..=30 {
        c.handle_put(t(rv), pod(&format!("p{rv}"), rv, "n1")).unwrap();
        drain(&mut c);
    }
    c.handle_timeout(t(10_000));
    drain(&mut c);
    let all = c.watchers();
    let lagging = all.iter().find(|w| w.id == slow).expect("the slow watch is open");
    assert_eq!(lagging.state, WatcherState::Lagging, "{lagging:?}");
    let s = c.watcher_summary();
    assert_eq!(s.open, 2);
    assert_eq!(s.lagging, 1);
    assert_eq!(s.max_lag, lagging.lag);
    assert!(s.max_lag > 0);
    assert_eq!(c.first_watchers(1), all[..1]);
    assert_eq!(c.first_watchers(0), []);
    assert_eq!(c.first_watchers(5), all);
    c.check_invariants();
}
