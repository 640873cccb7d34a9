//! etcdctl, unmodified, against watchcache and against etcd: the same commands give the same
//! output (writes, reads, watches from a revision, transactions, leases, interactive progress
//! requests, which etcd's gRPC proxy leaves unanswered).

use crate::support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{etcdctl, Env};

fn bin() -> std::path::PathBuf {
    host_etcd::etcd_launcher::find_binary("etcdctl")
        .expect("etcdctl not found: run make setup-etcd")
}

/// Runs `etcdctl ARGS` with `input` on stdin, stopping it after `wait`; returns its stdout.
fn run_for(endpoint: &str, args: &[&str], input: &[(&str, Duration)], wait: Duration) -> String {
    let mut child = Command::new(bin())
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl");
    let mut stdin = child.stdin.take().expect("stdin");
    for (line, pause) in input {
        stdin.write_all(line.as_bytes()).expect("write");
        stdin.write_all(b"\n").expect("write");
        stdin.flush().expect("flush");
        std::thread::sleep(*pause);
    }
    let start = Instant::now();
    while start.elapsed() < wait {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(stdin);
    let mut out = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_sees_the_same_through_watchcache() {
    let env = Env::start().await;
    let (direct, cache) = (env.etcd.endpoint(), env.grpc());
    // Writes through the cache land in etcd.
    etcdctl(&cache, &["put", "/e/a", "1"]);
    etcdctl(&cache, &["put", "/e/b", "2"]);
    etcdctl(&direct, &["put", "/e/c", "3"]);
    etcdctl(&cache, &["del", "/e/b"]);
    let txn = run_for(
        &cache,
        &["txn"],
        &[
            ("", Duration::ZERO),
            ("put /e/t1 x", Duration::ZERO),
            ("put /e/t2 y", Duration::ZERO),
            ("", Duration::ZERO),
            ("", Duration::ZERO),
        ],
        Duration::from_secs(5),
    );
    assert!(txn.contains("SUCCESS"), "{txn}");
    let rev = env.etcd_rev().await;
    env.wait_cache_rev(rev).await;
    for args in [
        vec!["get", "--prefix", "/e/"],
        vec!["get", "--prefix", "/e/", "--keys-only"],
        vec!["get", "--prefix", "/e/", "--count-only", "-w", "fields"],
        vec!["get", "--prefix", "/e/", "--limit", "2", "-w", "json"],
        vec!["get", "--prefix", "/e/", "--rev", "3"],
        vec!["get", "--prefix", "/e/", "--consistency", "s"],
        vec!["get", "/e/a", "-w", "fields"],
        vec!["get", "--prefix", "/e/", "--sort-by", "VALUE", "--order", "DESCEND"],
    ] {
        assert_eq!(etcdctl(&direct, &args), etcdctl(&cache, &args), "etcdctl {args:?}");
    }
    // Watch from a revision: history then live events, the same on both.
    let from = format!("{}", rev - 3);
    let watch = |ep: String, from: String| {
        std::thread::spawn(move || {
            run_for(
                &ep,
                &["watch", "--prefix", "/e/", "--rev", &from, "--prev-kv"],
                &[],
                Duration::from_secs(3),
            )
        })
    };
    let (wd, wc) = (watch(direct.clone(), from.clone()), watch(cache.clone(), from));
    std::thread::sleep(Duration::from_millis(800));
    etcdctl(&direct, &["put", "/e/live", "now"]);
    let (wd, wc) = (wd.join().expect("watch"), wc.join().expect("watch"));
    assert!(wd.contains("/e/live"), "{wd}");
    assert_eq!(wd, wc, "etcdctl watch --rev");
    // Interactive progress requests are answered (the gRPC proxy ignores them).
    let out = run_for(
        &cache,
        &["watch", "-i"],
        &[
            ("watch /e/ --prefix", Duration::from_millis(700)),
            ("progress", Duration::from_millis(700)),
        ],
        Duration::from_secs(2),
    );
    let rev = env.etcd_rev().await;
    assert!(out.contains(&format!("progress notify: {rev}")), "{out}");
    // Leases, members, status, compaction.
    let lease = etcdctl(&cache, &["lease", "grant", "60"]);
    let id = lease.split_whitespace().nth(1).expect("lease id").to_owned();
    etcdctl(&cache, &["put", "/e/leased", "v", "--lease", &id]);
    assert!(etcdctl(&cache, &["lease", "timetolive", &id, "--keys"]).contains("/e/leased"));
    etcdctl(&cache, &["lease", "revoke", &id]);
    assert_eq!(etcdctl(&direct, &["member", "list"]), etcdctl(&cache, &["member", "list"]));
    assert!(etcdctl(&cache, &["endpoint", "health"]).contains("is healthy"));
    let rev = env.etcd_rev().await;
    etcdctl(&cache, &["compaction", &format!("{}", rev - 1)]);
    let old = Command::new(bin())
        .arg(format!("--endpoints={cache}"))
        .args(["get", "/e/a", "--rev", "2"])
        .output()
        .expect("etcdctl");
    assert!(!old.status.success());
    assert!(String::from_utf8_lossy(&old.stderr).contains("required revision has been compacted"));
}
