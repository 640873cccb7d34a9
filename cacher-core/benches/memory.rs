//! Memory per idle watcher and per cached object: `cargo bench -p cacher-core --bench memory`.

#[path = "support/memory_measure.rs"]
mod memory_measure;

#[global_allocator]
static ALLOC: memory_measure::Counting = memory_measure::Counting;

fn main() {
    let r = memory_measure::measure();
    println!(
        "memory/idle_watcher_bytes           {:8.1}  (target <= 1024)",
        r.bytes_per_idle_watcher
    );
    println!(
        "memory/object_overhead_bytes        {:8.1}  (beyond key and value; target <= 100)",
        r.object_overhead_bare
    );
    println!(
        "memory/object_overhead_bytes_attrs  {:8.1}  (same, objects with 2 labels and 3 fields)",
        r.object_overhead_with_attrs
    );
    println!(
        "memory/attrs_bytes_per_object       {:8.1}  (the labels and fields themselves)",
        r.attrs_bytes
    );
}
