// Shared by `benches/memory.rs` (prints) and `tests/memory.rs` (asserts the targets): memory
// the core allocates per idle watcher and per cached object, counted by a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use cacher_core::{Attrs, Cacher, Config, Key, KeyRange, Object, RvParam, Timestamp, WatchRequest};

/// Counts live heap bytes.
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes now.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The figures.
pub struct Report {
    /// Heap bytes per registered watcher with nothing queued.
    pub bytes_per_idle_watcher: f64,
    /// Store bytes per object beyond key and value (objects without attributes).
    pub object_overhead_bare: f64,
    /// The same for objects with labels and fields (their own bytes excluded).
    pub object_overhead_with_attrs: f64,
    /// The labels' and fields' own bytes per object.
    pub attrs_bytes: f64,
}

fn objects(n: usize, attrs: bool) -> (Vec<Object>, usize) {
    let mut payload = 0;
    let objs = (0..n)
        .map(|i| {
            let key = format!("/registry/pods/ns-{}/pod-{i:08}", i % 100);
            let value = vec![b'v'; 200];
            payload += key.len() + value.len();
            let o = Object::new(key.as_bytes(), Some(&value), 1);
            if attrs {
                let ns = format!("ns-{}", i % 100);
                let name = format!("pod-{i:08}");
                o.with_attrs(Attrs::new(
                    [("app", "web"), ("pod-template-hash", "7d9f8c6b5")],
                    [
                        ("metadata.namespace", ns.as_str()),
                        ("metadata.name", name.as_str()),
                        ("spec.nodeName", "node-1"),
                    ],
                ))
            } else {
                o
            }
        })
        .collect();
    (objs, payload)
}

/// Measures everything.
pub fn measure() -> Report {
    // Objects: build them, then measure everything alive that the store holds.
    let n = 200_000;
    let bare = measure_objects(n, false);
    let with_attrs = measure_objects(n, true);

    // Idle watchers: registered, nothing to deliver.
    let now = Timestamp::from_millis(0);
    let mut c = Cacher::new(Config::default(), now).expect("config");
    let (objs, _) = objects(1_000, true);
    c.handle_replace(now, 1, objs).expect("replace");
    while c.poll_output().is_some() {}
    let watchers = 10_000;
    let before = live();
    for _ in 0..watchers {
        // The request's own allocations (its key) stay with the watcher, so they count.
        let r = WatchRequest::new(KeyRange::Prefix(Key::from("/registry/pods/")), RvParam::At(1));
        c.start_watch(now, r).expect("watch");
    }
    while c.poll_output().is_some() {}
    let after = live();
    let per_watcher = (after - before) as f64 / watchers as f64;
    Report {
        bytes_per_idle_watcher: per_watcher,
        object_overhead_bare: bare.0,
        object_overhead_with_attrs: with_attrs.0,
        attrs_bytes: with_attrs.1,
    }
}

/// (store bytes per object beyond key and value, attribute bytes per object).
fn measure_objects(n: usize, attrs: bool) -> (f64, f64) {
    let now = Timestamp::from_millis(0);
    let base = live();
    let mut c = Cacher::new(Config::default(), now).expect("config");
    let (objs, payload) = objects(n, attrs);
    // The attributes' own allocations: objects of the same shape with and without them.
    let attrs_bytes = if attrs {
        let b = live();
        let with = objects(1_000, true);
        let with_cost = live() - b;
        drop(with);
        let b = live();
        let without = objects(1_000, false);
        let without_cost = live() - b;
        drop(without);
        (with_cost - without_cost) as f64 / 1_000.0
    } else {
        0.0
    };
    c.handle_replace(now, 1, objs).expect("replace");
    while c.poll_output().is_some() {}
    let total = live() - base; // the cacher, the store and the objects inside it
    let empty = {
        let b = live();
        let e = Cacher::new(Config::default(), now).expect("config");
        let x = live() - b;
        drop(e);
        x
    };
    let store = (total - empty) as f64;
    drop(c);
    ((store - payload as f64) / n as f64 - attrs_bytes, attrs_bytes)
}
