//! Every input committed under `tests/fuzz_regressions/<target>/` (crashers found by
//! `make fuzz-smoke` or longer runs) replayed through the same entry point as its fuzz target.

use std::fs;
use std::path::Path;

fn replay_dir(target: &str, f: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions").join(target);
    let mut n = 0;
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.file_name().is_some_and(|n| n == ".gitkeep") {
            continue;
        }
        let data = fs::read(&path).expect("read");
        f(&data);
        n += 1;
    }
    n
}

#[test]
fn scenario_crashers() {
    replay_dir("scenario", cacher_core::fuzzing::scenario);
}

#[test]
fn selector_crashers() {
    replay_dir("selector", cacher_core::fuzzing::selector);
}

#[test]
fn ops_crashers() {
    replay_dir("ops", cacher_core::fuzzing::ops);
}
