//! Runs a workload file and prints its report:
//! `cargo run --release -p cacher-core --example simulate -- scenarios/simulate/reconnect_storm.json`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: simulate WORKLOAD.json");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    match cacher_core::simulate::simulate_str(&text) {
        Ok(report) => {
            print!("{}", cacher_core::simulate::report_to_json(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            ExitCode::from(1)
        }
    }
}
