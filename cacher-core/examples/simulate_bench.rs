//! Times the workload simulation on the target workload: one simulated hour of 200
//! writes/s to 1 000 watchers (bookmarks on, every other setting at its default).
//!
//! `cargo run --release -p cacher-core --example simulate_bench [-- RUNS]` prints each run's
//! wall time, then the best and median in ms and the report's headline figures as JSON.

use std::time::Instant;

use cacher_core::simulate::{self, Workload};

// A host program: it may read the clock (the rule is for the core library).
#[allow(clippy::disallowed_methods)]
fn main() {
    let runs: usize = std::env::args().nth(1).map_or(3, |r| r.parse().expect("RUNS"));
    let mut workload = Workload { duration_s: 3600.0, ..Workload::default() };
    workload.writes.rate_per_s = 200.0;
    workload.watchers.count = 1000;
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for run in 0..runs.max(1) {
        let t = Instant::now();
        let report = simulate::run(&workload).expect("a valid workload");
        let elapsed = t.elapsed().as_secs_f64() * 1000.0;
        eprintln!("run {}: {elapsed:.0} ms", run + 1);
        times.push(elapsed);
        last = Some(report);
    }
    times.sort_by(f64::total_cmp);
    let s = last.expect("at least one run").summary;
    println!(
        "{{\"workload\": \"3600 s, 200 writes/s, 1000 watchers\", \"best_ms\": {:.0}, \"median_ms\": {:.0}, \
         \"runs\": {}, \"events_written\": {}, \"deliveries\": {}, \"bookmarks_sent\": {}, \
         \"deliveries_per_s_of_wall_time\": {:.0}}}",
        times[0],
        times[times.len() / 2],
        times.len(),
        s.events_written,
        s.deliveries,
        s.bookmarks_sent,
        s.deliveries as f64 / (times[times.len() / 2] / 1000.0),
    );
}
