//! Criterion benchmarks of the core's hot paths: `cargo bench -p cacher-core --bench core`.
//! Figures are recorded in BENCHMARKS.md.
//!
//! - dispatch: one storage event to N cluster-wide watchers (deliveries per second);
//! - dispatch with the trigger index: N watchers each on its own node, one event for one node;
//! - replay: a watch resuming from the middle of a 100 000-event window;
//! - list RV=0 of 100 000 objects, with and without a label selector;
//! - a page of 500 from 10 000 and from 1 000 000 objects.

use std::hint::black_box;

use cacher_core::{
    Attrs, Cacher, Config, FieldSelector, Key, KeyRange, LabelSelector, ListRequest, Object,
    Output, Profile, RvParam, Timestamp, WatchRequest,
};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

const NOW: Timestamp = Timestamp::from_millis(1_000);

fn pod(i: u64, rv: u64, node: &str) -> Object {
    let name = format!("pod-{i:07}");
    let key = format!("/pods/ns-{}/{name}", i % 50);
    Object::new(key.as_bytes(), Some(&[b'x'; 64]), rv).with_attrs(Attrs::new(
        [("app", if i % 4 == 0 { "web" } else { "db" })],
        [
            ("metadata.namespace", format!("ns-{}", i % 50)),
            ("metadata.name", name),
            ("spec.nodeName", node.to_owned()),
        ],
    ))
}

fn drain(c: &mut Cacher) -> usize {
    let mut delivered = 0;
    while let Some(out) = c.poll_output() {
        match out {
            Output::Fanout { targets, .. } => delivered += targets.len(),
            Output::Deliver { events, .. } => delivered += events.len(),
            _ => {}
        }
    }
    delivered
}

fn cacher_with(objects: u64, cfg: Config) -> Cacher {
    let mut c = Cacher::new(cfg, Timestamp::ZERO).expect("config");
    let objs = (0..objects).map(|i| pod(i, 1, "node-0")).collect();
    c.handle_replace(NOW, 1, objs).expect("replace");
    drain(&mut c);
    c
}

fn dispatch_cluster_wide(cr: &mut Criterion) {
    let mut g = cr.benchmark_group("dispatch_cluster_wide");
    for n in [10u64, 1_000, 10_000] {
        let mut c = cacher_with(1_000, Config::default());
        for _ in 0..n {
            c.start_watch(
                NOW,
                WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(1)),
            )
            .unwrap();
        }
        drain(&mut c);
        let mut rv = 1;
        g.throughput(Throughput::Elements(n));
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                rv += 1;
                c.handle_put(NOW, pod(rv % 1_000, rv, "node-0")).unwrap();
                let d = drain(&mut c);
                debug_assert_eq!(d as u64, n);
                black_box(d)
            })
        });
    }
    g.finish();
}

fn dispatch_trigger_index(cr: &mut Criterion) {
    // 10 000 pods, pod p bound to node p % n (pods never move); one update per iteration goes
    // to exactly one kubelet-style watcher, whatever n.
    let mut g = cr.benchmark_group("dispatch_by_node");
    const PODS: u64 = 10_000;
    for n in [10u64, 1_000, 10_000] {
        let cfg = Config { index_field: Some("spec.nodeName".into()), ..Config::default() };
        let nodes: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
        let mut c = Cacher::new(cfg, Timestamp::ZERO).expect("config");
        let objs = (0..PODS).map(|p| pod(p, 1, &nodes[(p % n) as usize])).collect();
        c.handle_replace(NOW, 1, objs).unwrap();
        for node in &nodes {
            let mut req = WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(1));
            req.selector.fields = FieldSelector::parse(&format!("spec.nodeName={node}")).unwrap();
            c.start_watch(NOW, req).unwrap();
        }
        drain(&mut c);
        let mut rv = 1;
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                rv += 1;
                let p = rv * 7919 % PODS;
                c.handle_put(NOW, pod(p, rv, &nodes[(p % n) as usize])).unwrap();
                let d = drain(&mut c);
                debug_assert_eq!(d, 1);
                black_box(d)
            })
        });
    }
    g.finish();
}

fn replay_from_middle(cr: &mut Criterion) {
    let mut g = cr.benchmark_group("replay_reconnect");
    let cfg = Config { capacity: 100_000, dynamic_capacity: false, ..Config::default() };
    let mut c = cacher_with(1_000, cfg);
    for rv in 2..=100_001u64 {
        c.handle_put(NOW, pod(rv % 1_000, rv, "node-0")).unwrap();
    }
    drain(&mut c);
    g.throughput(Throughput::Elements(50_000));
    g.sample_size(20);
    g.bench_function("from_middle_of_100k_window", |b| {
        b.iter(|| {
            let w = c
                .start_watch(
                    NOW,
                    WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(50_001)),
                )
                .unwrap();
            let d = drain(&mut c);
            assert_eq!(d, 50_000);
            c.stop_watch(NOW, w);
            drain(&mut c);
        })
    });
    g.finish();
}

fn list_rv0(cr: &mut Criterion) {
    let mut g = cr.benchmark_group("list_rv0_100k");
    g.sample_size(20);
    let mut c = cacher_with(100_000, Config::default());
    g.throughput(Throughput::Elements(100_000));
    for (name, sel) in [("no_selector", ""), ("label_selector", "app=web")] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut req =
                    ListRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::Zero);
                req.selector.labels = LabelSelector::parse(sel).unwrap();
                c.list(NOW, req).unwrap();
                black_box(drain_list(&mut c))
            })
        });
    }
    g.finish();
}

fn drain_list(c: &mut Cacher) -> usize {
    let mut n = 0;
    while let Some(out) = c.poll_output() {
        if let Output::List { outcome: cacher_core::ReadOutcome::Cache(r), .. } = out {
            n += r.items.len();
        }
    }
    n
}

fn list_page(cr: &mut Criterion) {
    // A page of 500 continuing at a random key of the whole prefix (a continue token read from
    // the snapshot at its RV, as 1.34 serves it).
    let mut g = cr.benchmark_group("list_page_500");
    for objects in [10_000u64, 1_000_000] {
        let mut c = cacher_with(objects, Config::for_profile(Profile::V1_34));
        g.throughput(Throughput::Elements(500));
        g.bench_function(BenchmarkId::from_parameter(objects), |b| {
            let mut i = 0u64;
            b.iter_batched(
                || {
                    // A pod of namespace ns-0, the first in key order, so 500 keys follow.
                    i = (i + 7919 * 50) % objects / 50 * 50;
                    let start = format!("/pods/ns-0/pod-{i:07}");
                    let mut req =
                        ListRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::Unset);
                    req.limit = 500;
                    req.continue_token =
                        cacher_core::continue_token::encode(start.as_bytes(), b"/pods/", 1);
                    req
                },
                |req| {
                    c.list(NOW, req).unwrap();
                    let n = drain_list(&mut c);
                    assert_eq!(n, 500);
                    n
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    dispatch_cluster_wide,
    dispatch_trigger_index,
    replay_from_middle,
    list_rv0,
    list_page
);
criterion_main!(benches);
