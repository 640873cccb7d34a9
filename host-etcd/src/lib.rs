//! # host-etcd: the `watchcache` server and library
//!
//! kube-apiserver's watch cache (the sans-IO [`cacher_core`]) in front of etcd, serving
//! etcd's own gRPC API so that etcdctl and every etcd client work against it unchanged.
//!
//! | module | what it owns | counterpart |
//! |---|---|---|
//! | `server` | wiring: caches, reflectors, gRPC and HTTP listeners, shutdown | kube-apiserver's storage factory + `NewCacherFromConfig` |
//! | `cache` | the task that owns one prefix's core; deliveries, credit, reads | the goroutines around a `Cacher` (`cacher.go`) |
//! | `reflector` | list at one revision, watch with progress notify, re-watch, relist | client-go `reflector.go`, `storage/etcd3/watcher.go` |
//! | `watch_service` | etcd `Watch` streams: cached or passed through, progress | etcd `v3rpc/watch.go`, `grpcproxy/watch.go` |
//! | `kv_service` | etcd `Range` from the cache, `Compact` | etcd `v3rpc/key.go`, `txn/range.go` |
//! | `forward` | every other call, passed through to etcd | the gRPC proxy's per-service forwarding |
//! | `auth` | what a client may read, decided by etcd, cached briefly | etcd `auth/store.go`, `isWatchPermitted` |
//! | `http_api` | `/metrics`, `/healthz`, `/readyz`, `/debug/state`, Kubernetes-style list/watch | apiserver `endpoints/handlers` |
//! | `metrics` | Prometheus text | `storage/cacher/metrics/metrics.go` |
//! | `proto` | encode once per revision, frame per watcher | etcd `mvccpb`, `etcdserverpb` |
//! | `upstream` | the connection to etcd | `clientv3` |
//! | `etcd_launcher` | a real etcd child process (embedded default, tests, benchmarks) | etcd's `integration` framework |
//! | `clock` | the only clock | — |

pub mod auth;
pub mod cache;
pub mod clock;
pub mod etcd_launcher;
mod forward;
mod http_api;
mod kv_service;
pub mod metrics;
pub mod proto;
pub mod reflector;
pub mod server;
pub mod upstream;
mod watch_service;

pub use cache::{CacheHandle, CacheOptions, CacheStatus};
pub use etcd_launcher::{EmbeddedEtcd, EtcdOptions};
pub use reflector::ReflectorOptions;
pub use server::{ServeConfig, Server, ServerTls};
pub use upstream::{EtcdTls, Upstream, UpstreamConfig};

/// Parses a duration as etcd and Kubernetes flags write them: `100ms`, `5s`, `10m`, `1h`, or
/// a combination (`1m30s`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total_ms: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {s:?}: expected a number"));
        }
        let n: u128 = rest[..digits].parse().map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms = match unit {
            "ms" => n,
            "s" => n * 1000,
            "m" => n * 60_000,
            "h" => n * 3_600_000,
            "" => return Err(format!("invalid duration {s:?}: missing unit (ms, s, m, h)")),
            u => return Err(format!("invalid duration {s:?}: unknown unit {u:?}")),
        };
        total_ms = total_ms.saturating_add(ms);
    }
    Ok(std::time::Duration::from_millis(total_ms.min(u64::MAX as u128) as u64))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
