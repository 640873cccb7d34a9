//! Round trips of calls that watchcache passes through to etcd, against etcd's own, measured
//! interleaved (one call to each target in turn, so that the machine's drift hits all alike):
//! `Put`, `Txn` (a compare and a put, as kube-apiserver's creates) and a linearizable `Range`
//! of one key outside every cached prefix (passed through as well).
//!
//! ```sh
//! cargo run --release -p host-etcd --example passthrough_latency -- \
//!     --target etcd=127.0.0.1:2379 --target watchcache=127.0.0.1:2479 [--target proxy=...] [--calls 2000]
//! ```
//! The first target is the reference for the ratios. Prints p50 / p90 / p99 in µs per call kind
//! and target, and each target's p50 and p90 as a multiple of the reference's.

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

struct Target {
    name: String,
    client: Client,
    samples: [Vec<Duration>; 3],
}

const KINDS: [&str; 3] = ["put", "txn", "get (passed through)"];

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn usage() -> ! {
    eprintln!("usage: passthrough_latency --target NAME=HOST:PORT [--target ...] [--calls N] [--key-prefix P]");
    std::process::exit(2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut targets: Vec<(String, String)> = Vec::new();
    let mut calls = 2000usize;
    let mut prefix = "/passthrough/".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--target" => {
                let v = args.next().unwrap_or_else(|| usage());
                let (n, addr) = v.split_once('=').unwrap_or_else(|| usage());
                targets.push((n.to_owned(), addr.to_owned()));
            }
            "--calls" => {
                calls = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage())
            }
            "--key-prefix" => prefix = args.next().unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    if targets.is_empty() {
        usage();
    }
    let mut ts = Vec::new();
    for (name, addr) in targets {
        let client = Client::connect([addr.as_str()], None)
            .await
            .unwrap_or_else(|e| panic!("connecting to {name} at {addr}: {e}"));
        ts.push(Target { name, client, samples: [Vec::new(), Vec::new(), Vec::new()] });
    }
    // The read goes to a key outside the cached prefix (watchcache passes it through).
    let outside = "\u{1}outside";
    let value = vec![b'v'; 64];
    for warm in [true, false] {
        let n = if warm { calls / 10 } else { calls };
        for i in 0..n {
            for t in ts.iter_mut() {
                let key = format!("{prefix}{}/{}", t.name, i % 100);
                let start = Instant::now();
                t.client.put(key.clone(), value.clone(), None).await.expect("put");
                let put = start.elapsed();
                let txn = Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
                    .and_then([TxnOp::put(key, value.clone(), None)]);
                let start = Instant::now();
                t.client.txn(txn).await.expect("txn");
                let txn = start.elapsed();
                let start = Instant::now();
                t.client.get(outside, None).await.expect("get");
                let get = start.elapsed();
                if !warm {
                    for (s, d) in t.samples.iter_mut().zip([put, txn, get]) {
                        s.push(d);
                    }
                }
            }
        }
    }
    println!("{calls} calls of each kind per target, interleaved (µs: p50 / p90 / p99; ratio of p50 and p90 to {}'s)", ts[0].name);
    println!("| kind | target | p50 | p90 | p99 | p50 ratio | p90 ratio |");
    println!("|---|---|---|---|---|---|---|");
    for t in ts.iter_mut() {
        for s in t.samples.iter_mut() {
            s.sort();
        }
    }
    for (k, kind) in KINDS.iter().enumerate() {
        let reference = (percentile(&ts[0].samples[k], 0.5), percentile(&ts[0].samples[k], 0.9));
        for t in &ts {
            let s = &t.samples[k];
            let (p50, p90, p99) = (percentile(s, 0.5), percentile(s, 0.9), percentile(s, 0.99));
            println!(
                "| {kind} | {} | {} | {} | {} | {:.2}× | {:.2}× |",
                t.name,
                p50.as_micros(),
                p90.as_micros(),
                p99.as_micros(),
                p50.as_secs_f64() / reference.0.as_secs_f64(),
                p90.as_secs_f64() / reference.1.as_secs_f64(),
            );
        }
    }
}
