//! Two background checks per cache that keep it honest against etcd:
//!
//! - **Compaction probe**: etcd may be compacted by someone else (kube-apiserver's compactor,
//!   an operator). Before the cache serves a read or a watch at a revision below its own, it
//!   needs an answer younger than `compaction_probe` (1 s) to "does etcd still have the oldest
//!   revision the cache would serve?" (a read of one key at that revision, refused by etcd once
//!   compacted); when not, the probe learns the exact compaction revision (a watch from there,
//!   which etcd cancels naming it), so nothing below it is served from memory any more: Ranges
//!   and watches there go to etcd and get etcd's own `ErrCompacted`. The cache task holds such
//!   requests and sends the probe (`cache/mod.rs`: `CompactionGate`, `probe_compaction`). Cost on etcd: at most one
//!   single-key read per second per prefix, and only while past revisions are asked for;
//!   nothing at rest or for reads and watches at the current revision.
//! - **Consistency checker** (Kubernetes' KEP-4988): every `consistency_check_interval`
//!   (5 min) it takes a digest of the cache's objects (keys and revisions) at the cache's
//!   revision R and the same digest of a paginated keys-only list from etcd at R; on a
//!   mismatch the cache relists. Cost: one keys-only paginated list per interval per prefix.
//!
//! - **Membership**: every `membership_check` (5 s) it re-reads etcd's member list, so that a
//!   linearizable read learns etcd's revision from a watch's `created` answer only while etcd
//!   is one voting member (`Freshness::Auto`). Cost: one MemberList per interval per prefix.
//!
//! Kubernetes counterparts: `storage/cacher/cacher.go`'s compaction following (1.34) and
//! `storage/cacher/consistency/checker.go` (1.34+).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, warn};

use crate::cache::CacheHandle;
use crate::keys::prefix_range;
use crate::metrics::HostMetrics;
use crate::upstream::Upstream;

/// The digest of a set of objects: FNV-1a over each key and its revision, in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub struct Digest {
    /// The hash.
    pub hash: u64,
    /// Objects hashed.
    pub count: u64,
}

impl Digest {
    /// Adds one object (call in key order).
    pub fn add(&mut self, key: &[u8], mod_revision: u64) {
        let mut h = if self.count == 0 { 0xcbf2_9ce4_8422_2325 } else { self.hash };
        for b in key.iter().copied().chain([0u8]).chain(mod_revision.to_be_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.hash = h;
        self.count += 1;
    }
}

/// Keeps `upstream`'s count of etcd's voting members current until shutdown.
pub(crate) async fn follow_membership(
    upstream: Upstream,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if let Err(e) = upstream.refresh_members().await {
            debug!(error = %e, "reading etcd's member list failed; linearizable reads use quorum reads meanwhile");
        }
        if period.is_zero() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The outcome of one consistency check.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CheckResult {
    /// The cache holds what etcd holds at the revision.
    Match {
        /// The revision compared at.
        revision: u64,
        /// Objects compared.
        objects: u64,
    },
    /// It does not: the cache relists.
    Mismatch {
        /// The revision compared at.
        revision: u64,
        /// The cache's digest.
        cache: Digest,
        /// etcd's digest.
        etcd: Digest,
    },
    /// Not compared (not ready, etcd unreachable, the revision compacted meanwhile).
    Skipped(String),
}

/// Checks `cache` against etcd now.
pub async fn check_once(
    cache: &CacheHandle,
    upstream: &Upstream,
    metrics: &HostMetrics,
) -> CheckResult {
    let Some((revision, objects)) = cache.objects().await else {
        return CheckResult::Skipped("the cache is not ready".into());
    };
    let mut digest = Digest::default();
    for o in &objects {
        digest.add(o.key(), o.rv());
    }
    drop(objects);
    let (start, end) = prefix_range(cache.prefix());
    let mut kv = upstream.kv();
    let mut theirs = Digest::default();
    let mut key = start;
    loop {
        metrics.count_upstream_request("consistency_list");
        let opts = etcd_client::GetOptions::new()
            .with_range(end.clone())
            .with_revision(revision as i64)
            .with_keys_only()
            .with_limit(10_000)
            .with_serializable();
        let mut resp = match kv.get(key.clone(), Some(opts)).await {
            Ok(r) => r,
            Err(e) => return CheckResult::Skipped(format!("etcd: {e}")),
        };
        let more = resp.more();
        let kvs = resp.take_kvs();
        for kv in &kvs {
            theirs.add(kv.key(), kv.mod_revision().max(0) as u64);
        }
        match kvs.last() {
            Some(last) if more => {
                key = last.key().to_vec();
                key.push(0);
            }
            _ => break,
        }
    }
    if theirs == digest {
        CheckResult::Match { revision, objects: digest.count }
    } else {
        CheckResult::Mismatch { revision, cache: digest, etcd: theirs }
    }
}

/// Checks `cache` every `period` until shutdown (zero: never); on a mismatch the cache relists.
pub(crate) async fn check_periodically(
    cache: CacheHandle,
    upstream: Upstream,
    metrics: Arc<HostMetrics>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    if period.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let result = check_once(&cache, &upstream, &metrics).await;
        match &result {
            CheckResult::Match { .. } => metrics.count_consistency_check("match"),
            CheckResult::Skipped(why) => {
                debug!(prefix = %cache.prefix_str(), %why, "consistency check skipped");
                metrics.count_consistency_check("error");
            }
            CheckResult::Mismatch { revision, cache: c, etcd } => {
                warn!(prefix = %cache.prefix_str(), revision, cache_objects = c.count, etcd_objects = etcd.count, "the cache differs from etcd; relisting");
                metrics.count_consistency_check("mismatch");
                cache.relist(format!("consistency check failed at revision {revision}"));
            }
        }
        cache.note_check(serde_json::to_value(&result).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_keys_and_revisions_apart() {
        let d = |items: &[(&str, u64)]| {
            let mut d = Digest::default();
            for (k, r) in items {
                d.add(k.as_bytes(), *r);
            }
            d
        };
        let a = d(&[("/a", 1), ("/b", 2)]);
        assert_eq!(a, d(&[("/a", 1), ("/b", 2)]));
        assert_ne!(a, d(&[("/a", 1), ("/b", 3)]));
        assert_ne!(a, d(&[("/a", 1)]));
        assert_ne!(a, d(&[("/a", 1), ("/c", 2)]));
        assert_ne!(d(&[("/ab", 1)]), d(&[("/a", 1)]));
    }
}
