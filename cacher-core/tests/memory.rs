//! The memory targets: at most 1 KiB per idle watcher, at most 100 B per cached object beyond its
//! key and value (counted by a global allocator; see benches/support/memory_measure.rs).

#[path = "../benches/support/memory_measure.rs"]
mod memory_measure;

#[global_allocator]
static ALLOC: memory_measure::Counting = memory_measure::Counting;

#[test]
fn memory_targets() {
    let r = memory_measure::measure();
    println!(
        "idle watcher {:.1} B, object overhead {:.1} B (with attrs {:.1} B + {:.1} B of attributes)",
        r.bytes_per_idle_watcher, r.object_overhead_bare, r.object_overhead_with_attrs, r.attrs_bytes
    );
    assert!(r.bytes_per_idle_watcher <= 1024.0, "{} B per idle watcher", r.bytes_per_idle_watcher);
    assert!(r.object_overhead_bare <= 100.0, "{} B per object", r.object_overhead_bare);
    assert!(
        r.object_overhead_with_attrs <= 100.0,
        "{} B per object with attrs",
        r.object_overhead_with_attrs
    );
}
