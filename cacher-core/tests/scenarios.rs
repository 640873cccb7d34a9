//! Replays every scenario under `scenarios/` and compares its trace with the golden file beside
//! it (`NAME.trace.json`). `UPDATE_GOLDENS=1 cargo test -p cacher-core --test scenarios`
//! rewrites the goldens; review the diff before committing.
//!
//! Scenarios under `scenarios/invalid/` must fail to parse or replay, with the error in
//! `NAME.error.txt`.

use std::fs;
use std::path::{Path, PathBuf};

fn scenario_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.ends_with(".json") && !n.ends_with(".trace.json")
        })
        .collect();
    files.sort();
    files
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

#[test]
fn every_scenario_matches_its_golden_trace() {
    let update = std::env::var_os("UPDATE_GOLDENS").is_some();
    let files = scenario_files(&root());
    assert!(files.len() >= 30, "expected at least 30 scenarios, found {}", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read scenario");
        let trace = match cacher_core::replay::replay_str(&text) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        let json = cacher_core::replay::trace_to_json(&trace);
        // The same scenario twice gives the same bytes.
        let again =
            cacher_core::replay::trace_to_json(&cacher_core::replay::replay_str(&text).unwrap());
        assert_eq!(json, again, "{}: replay is not deterministic", file.display());
        let golden = file.with_extension("trace.json");
        if update {
            fs::write(&golden, &json).expect("write golden");
            continue;
        }
        match fs::read_to_string(&golden) {
            Ok(want) if want == json => {}
            Ok(want) => failures.push(format!(
                "{}: trace differs from {}\n{}",
                file.display(),
                golden.display(),
                first_difference(&want, &json)
            )),
            Err(_) => {
                failures.push(format!("{}: no golden trace {}", file.display(), golden.display()))
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn invalid_scenarios_fail_with_their_message() {
    let update = std::env::var_os("UPDATE_GOLDENS").is_some();
    let dir = root().join("invalid");
    let files = scenario_files(&dir);
    assert!(!files.is_empty());
    for file in files {
        let text = fs::read_to_string(&file).expect("read scenario");
        let err = match cacher_core::replay::replay_str(&text) {
            Ok(_) => panic!("{}: expected an error", file.display()),
            Err(e) => format!("{e}\n"),
        };
        let expected = file.with_extension("error.txt");
        if update {
            fs::write(&expected, &err).expect("write");
            continue;
        }
        let want = fs::read_to_string(&expected)
            .unwrap_or_else(|_| panic!("missing {}", expected.display()));
        assert_eq!(err, want, "{}", file.display());
    }
}

fn first_difference(want: &str, got: &str) -> String {
    for (i, (a, b)) in want.lines().zip(got.lines()).enumerate() {
        if a != b {
            return format!("line {}:\n  want {a}\n  got  {b}", i + 1);
        }
    }
    format!("lengths differ: want {} lines, got {}", want.lines().count(), got.lines().count())
}
