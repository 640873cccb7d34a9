//! # host-etcd: the `watchcache` server and library
//!
//! kube-apiserver's watch cache (the sans-IO [`cacher_core`]) in front of etcd: as a library
//! inside a Rust program ([`Cache`]), or as the `watchcache` server that speaks etcd's own gRPC
//! API so that etcdctl and every etcd client work against it unchanged ([`Server`]).
//!
//! ## The library: an in-process etcd watch cache
//!
//! One list and one etcd watch feed the cache; watches and reads are served from memory with
//! etcd's semantics, and what memory cannot serve goes to etcd, transparently.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use host_etcd::{Cache, EmbeddedEtcd, EtcdOptions, GetOptions, Keys, WatchOptions};
//!
//! // A real etcd for the example (from .tools/bin or PATH: `make setup-etcd`).
//! let etcd = EmbeddedEtcd::start(EtcdOptions::default()).await?;
//! let mut client = etcd_client::Client::connect([etcd.endpoint()], None).await?;
//! client.put("/config/replicas", "3", None).await?;
//!
//! let cache = Cache::new(client.clone(), "/config/").await?;
//! cache.wait_ready(std::time::Duration::from_secs(5)).await?;
//!
//! // A consistent read, answered from memory once the cache has etcd's current revision.
//! let now = cache.get(Keys::prefix("/config/"), GetOptions::new()).await?;
//! assert_eq!(now.kvs()[0].value(), b"3");
//! let rev = now.header().map_or(0, |h| h.revision());
//!
//! // Changes after that revision, with etcd's watch semantics.
//! let mut changes = cache
//!     .watch(Keys::prefix("/config/"), WatchOptions::new().with_start_revision(rev + 1).with_prev_kv())
//!     .await?;
//! client.put("/config/replicas", "5", None).await?;
//! let resp = changes.next().await.expect("a response")?;
//! let ev = &resp.events()[0];
//! assert_eq!(ev.kv().map(|kv| kv.value()), Some(&b"5"[..]));
//! assert_eq!(ev.prev_kv().map(|kv| kv.value()), Some(&b"3"[..]));
//! cache.close().await;
//! # Ok(())
//! # }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! More in `host-etcd/examples/`: `config_watcher` and `service_registry`.
//!
//! ### Parity with etcd's Go `cache` package
//!
//! | etcd `cache` (Go, experimental) | this library |
//! |---|---|
//! | `New(client, prefix)`: one upstream watch per prefix, bootstrap by Get | [`Cache::new`]: paginated list at one revision (10 000 per page), one watch with progress notify |
//! | watch demux: active and lagging watchers, lagging ones resynced from history | the core's dispatch: a watcher that falls behind becomes a position in the ring buffer and is replayed from it; none is cancelled while its revision is in the window |
//! | history window of 2 048 revisions; older start revisions → compacted cancel | Kubernetes' ring buffer (dynamic 100 → 102 400 events, [`CacheConfig`]); older start revisions are served **by etcd** transparently and move back onto the cache once caught up; only etcd's own compaction ends a watch ([`Error::Compacted`]) |
//! | start revision 0 = now, inclusive start revisions | same |
//! | snapshots, `Get` at a revision in the window; ErrFutureRev, ErrCompacted | snapshots per revision (structural sharing); revisions outside them are read from etcd, which answers future and compacted revisions with its own errors |
//! | consistent `Get`: count-only quorum read, wait until the cache has it (progress requests every 100 ms, 3 s timeout, ErrCacheTimeout) | same mechanism (Kubernetes' consistent reads from cache); after the 3 s wait the read **falls back to etcd** instead of failing |
//! | `RequestProgress`, `WithProgressNotify` (10 min) | [`WatchStream::request_progress`], [`Cache::request_progress`], [`WatchOptions::with_progress_notify`] ([`CacheConfig::progress_notify_interval`]) |
//! | `Ready`/`WaitReady`, `Close` | [`Cache::ready`], [`Cache::wait_ready`], [`Cache::close`] (and drop) |
//! | unsupported: PrevKV, Fragment, FilterPut/FilterDelete, CountOnly, Limit, Sort | **added**: `prev_kv`, NOPUT/NODELETE filters, `limit` with `more` and `count` (pagination), `keys_only`, `count_only`; sorts other than by key go to etcd |
//! | keys outside the prefix: ErrKeyRangeInvalid | [`Error::OutsidePrefix`] |
//! | — | **added**: Kubernetes semantics through the core (profiles v1.30/v1.34, label and field selectors and the trigger index in the server's Kubernetes-style API), the watch-cache metrics and state ([`Cache::metrics`], [`Cache::status`], [`Cache::debug_state`], [`Cache::upstream_watches`]) |
//!
//! ## The server
//!
//! [`Server::start`] runs one cache per prefix behind etcd's gRPC API and an HTTP API;
//! `watchcache serve` is its command line (see the README).
//!
//! ## Layers, bottom up
//!
//! Each layer uses only the ones above it in this table; nothing imports from `server`.
//!
//! | module | what it owns | counterpart |
//! |---|---|---|
//! | `clock`, `keys`, `config`, `metrics`, `convert`, `queue` | the one clock; etcd's key conventions ↔ the core's ranges; the cache's configuration; the counters; core objects as etcd messages; a watch stream's two queues (cache → session → transport) | — ; `rpc.proto`; `cacher.go` `Config`; `metrics.go`; `mvccpb`; `cacheWatcher.input` |
//! | `upstream` | the connection to etcd | `clientv3` |
//! | `cache` | the task that owns one prefix's core, and the typed batches it hands to sessions (`cache::delivery`) | the goroutines around a `Cacher` (`cacher.go`) |
//! | `reflector` | list at one revision (with etcd's recent history), watch with progress notify, re-watch, relist; a bounded channel into the cache | client-go `reflector.go`, `storage/etcd3/watcher.go` |
//! | `consistency` | following etcd's compaction; comparing the cache with etcd | `cacher.go`'s compaction poll, `consistency/checker.go` |
//! | `session` | one etcd watch stream as a sans-IO state machine (cached or relayed watches, progress, ids), and its tokio driver (`session::driver`) | etcd `v3rpc/watch.go`, `grpcproxy/watch.go` |
//! | `library` | the embeddable [`Cache`]; [`library::range_from_cache`], the one Range-from-cache decision | etcd's `cache` package |
//! | `server` | gRPC services, forwarding, auth, HTTP, Prometheus text, the wire format | kube-apiserver's storage wiring, the gRPC proxy |
//! | `etcd_launcher` | a real etcd child process (embedded default, tests, benchmarks) | etcd's `integration` framework |

pub mod cache;
pub mod clock;
pub mod config;
pub mod consistency;
pub mod convert;
pub mod etcd_launcher;
pub mod keys;
pub mod library;
pub mod metrics;
pub mod queue;
pub mod reflector;
pub mod server;
pub mod session;
pub mod upstream;

pub use cache::{CacheHandle, CacheStatus};
pub use config::{host_core_config, CacheConfig, ReflectorOptions};
pub use etcd_launcher::{EmbeddedEtcd, EtcdOptions};
pub use keys::Keys;
pub use library::{Cache, Error, GetOptions, WatchOptions, WatchStream};
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
