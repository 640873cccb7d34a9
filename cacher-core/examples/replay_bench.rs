//! Times the Rust replay of a scenario file (the baseline of the Python and wasm replay
//! benchmarks): `replay_bench FILE [RUNS]` prints the best and median time in ms as JSON.

use std::time::Instant;

// A host program: it may read the clock (the rule is for the core library).
#[allow(clippy::disallowed_methods)]
fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: replay_bench FILE [RUNS]");
    let runs: usize = args.next().map_or(7, |r| r.parse().expect("RUNS"));
    let text = std::fs::read_to_string(&path).expect("read scenario");
    let mut times = Vec::with_capacity(runs);
    let mut records = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let trace = cacher_core::replay::replay_str(&text).expect("replay");
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        records = trace.len();
        drop(trace);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"best_ms\": {:.2}, \"median_ms\": {:.2}, \"records\": {records}, \"runs\": {runs}}}",
        times[0],
        times[runs / 2]
    );
}
