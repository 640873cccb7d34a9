//! The reflector of one prefix: a paginated list at one revision, then one watch from there
//! with progress notify; progress requests when the core asks; a re-watch from the last
//! revision when the watch breaks (etcd restarting), and a relist when etcd has compacted past
//! it or the core asks. Objects' labels and fields are read once here, from JSON values'
//! `metadata`. Its channel to the cache is bounded: while the cache is behind, the reflector
//! stops reading etcd's watch stream, and HTTP/2 flow control slows etcd's sending.
//!
//! Kubernetes counterparts: `client-go/tools/cache/reflector.go` (`ListAndWatch`, the
//! resume-from-last-RV rule, backoff) as the cacher drives it in `cacher.go` (`startCaching`),
//! with `storage/etcd3/watcher.go` for the etcd side (`WithProgressNotify`, `WithCreatedNotify`).

use std::sync::Arc;
use std::time::Duration;

use cacher_core::{Attrs, Change, Key, Object};
use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::cache::{ReflectorCtl, StorageMsg};
use crate::config::ReflectorOptions;
use crate::keys::prefix_range;
use crate::metrics::HostMetrics;
use crate::upstream::Upstream;

/// Labels and the fields the core indexes and selects on, from a JSON object's `metadata`
/// (and `spec.nodeName`); nothing for other values.
pub fn attrs_of(value: &[u8]) -> Option<Attrs> {
    #[derive(serde::Deserialize)]
    struct Doc {
        metadata: Option<Meta>,
        spec: Option<Spec>,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(rename = "nodeName")]
        node_name: Option<String>,
    }
    let first = value.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    let doc: Doc = serde_json::from_slice(value).ok()?;
    let meta = doc.metadata;
    let mut fields: Vec<(&str, String)> = Vec::new();
    let mut labels = std::collections::BTreeMap::new();
    if let Some(m) = meta {
        if let Some(n) = m.name {
            fields.push(("metadata.name", n));
        }
        if let Some(ns) = m.namespace {
            fields.push(("metadata.namespace", ns));
        }
        labels = m.labels.unwrap_or_default();
    }
    if let Some(node) = doc.spec.and_then(|s| s.node_name) {
        fields.push(("spec.nodeName", node));
    }
    if fields.is_empty() && labels.is_empty() {
        return None;
    }
    Some(Attrs::new(labels, fields))
}

/// An etcd key-value as a core object.
pub fn object_of(kv: &etcd_client::KeyValue) -> Object {
    let o = Object::new(kv.key(), Some(kv.value()), kv.mod_revision().max(0) as u64)
        .with_etcd_meta(kv.create_revision().max(0) as u64, kv.version(), kv.lease());
    match attrs_of(kv.value()) {
        Some(a) => o.with_attrs(a),
        None => o,
    }
}

/// Groups a watch response's events into whole revisions.
pub fn revisions_of(events: &[etcd_client::Event]) -> Vec<(u64, Vec<Change>)> {
    let mut out: Vec<(u64, Vec<Change>)> = Vec::new();
    for ev in events {
        let Some(kv) = ev.kv() else { continue };
        let rev = kv.mod_revision().max(0) as u64;
        let change = match ev.event_type() {
            EventType::Put => Change::Put(object_of(kv)),
            EventType::Delete => Change::Delete(Key::new(kv.key())),
        };
        match out.last_mut() {
            Some((r, changes)) if *r == rev => changes.push(change),
            _ => out.push((rev, vec![change])),
        }
    }
    out
}

enum WatchEnd {
    /// etcd compacted past the watch's revision: relist.
    Compacted(i64),
    /// The core asked for a relist.
    RelistAsked(String),
    /// The stream broke: re-watch from the last revision.
    Broken(String),
    /// Shutting down.
    Shutdown,
}

/// Runs the reflector until shutdown.
pub(crate) async fn run(
    prefix: Arc<[u8]>,
    upstream: Upstream,
    cache: mpsc::Sender<StorageMsg>,
    mut ctl: mpsc::UnboundedReceiver<ReflectorCtl>,
    metrics: Arc<HostMetrics>,
    opts: ReflectorOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = String::from_utf8_lossy(&prefix).into_owned();
    let mut backoff = opts.backoff_min;
    'relist: loop {
        if *shutdown.borrow() {
            return;
        }
        // Drop stale requests: a fresh list answers them all.
        while ctl.try_recv().is_ok() {}
        let rev = match list(&prefix, &upstream, &metrics, &opts).await {
            Ok((rev, objects)) => {
                debug!(prefix = %name, revision = rev, objects = objects.len(), "listed");
                if cache.send(StorageMsg::Replace { rv: rev, objects }).await.is_err() {
                    return;
                }
                backoff = opts.backoff_min;
                rev
            }
            Err(e) => {
                warn!(prefix = %name, error = %e, retry_in = ?backoff, "list failed");
                if sleep_or_shutdown(backoff, &mut shutdown).await {
                    return;
                }
                backoff = (backoff * 2).min(opts.backoff_max);
                continue 'relist;
            }
        };
        let mut next = rev + 1;
        loop {
            let end = watch_from(
                &prefix,
                &upstream,
                &cache,
                &mut ctl,
                &metrics,
                &opts,
                &mut next,
                &mut shutdown,
            )
            .await;
            match end {
                WatchEnd::Shutdown => return,
                WatchEnd::Compacted(c) => {
                    info!(prefix = %name, compact_revision = c, "etcd compacted past the cache's revision; relisting");
                    let _ = cache.send(StorageMsg::Compacted { rv: c.max(0) as u64 }).await;
                    let reason =
                        format!("etcd compacted the watch's revision (compact revision {c})");
                    let _ = cache.send(StorageMsg::Error { reason }).await;
                    continue 'relist;
                }
                WatchEnd::RelistAsked(reason) => {
                    debug!(prefix = %name, %reason, "relist asked by the cache");
                    continue 'relist;
                }
                WatchEnd::Broken(e) => {
                    warn!(prefix = %name, error = %e, retry_in = ?backoff, next_revision = next, "upstream watch broke; re-watching");
                    if sleep_or_shutdown(backoff, &mut shutdown).await {
                        return;
                    }
                    backoff = (backoff * 2).min(opts.backoff_max);
                }
            }
        }
    }
}

async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}

/// A paginated list of the prefix at one revision.
async fn list(
    prefix: &[u8],
    upstream: &Upstream,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
) -> Result<(u64, Vec<Object>), String> {
    let (start, end) = prefix_range(prefix);
    let mut kv = upstream.client.kv_client().max_decoding_message_size(opts.max_message_bytes);
    let mut key = start;
    let mut rev = 0i64;
    let mut objects = Vec::new();
    loop {
        let mut o = GetOptions::new().with_range(end.clone()).with_limit(opts.page_size);
        if rev > 0 {
            o = o.with_revision(rev);
        }
        metrics.count_upstream_request("list");
        let mut resp = kv.get(key.clone(), Some(o)).await.map_err(|e| e.to_string())?;
        if rev == 0 {
            let h = resp.header().ok_or("no header in etcd's list answer")?;
            rev = h.revision();
            upstream.note_header(h.cluster_id(), h.member_id(), h.raft_term());
        }
        let more = resp.more();
        let kvs = resp.take_kvs();
        objects.extend(kvs.iter().map(object_of));
        match kvs.last() {
            Some(last) if more => {
                key = last.key().to_vec();
                key.push(0);
            }
            _ => break,
        }
    }
    Ok((rev.max(0) as u64, objects))
}

#[allow(clippy::too_many_arguments)]
async fn watch_from(
    prefix: &[u8],
    upstream: &Upstream,
    cache: &mpsc::Sender<StorageMsg>,
    ctl: &mut mpsc::UnboundedReceiver<ReflectorCtl>,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
    next: &mut u64,
    shutdown: &mut watch::Receiver<bool>,
) -> WatchEnd {
    let (key, end) = prefix_range(prefix);
    let wopts = WatchOptions::new()
        .with_range(end)
        .with_start_revision(*next as i64)
        .with_progress_notify();
    metrics.count_upstream_request("watch");
    let mut client =
        upstream.client.watch_client().max_decoding_message_size(opts.max_message_bytes);
    let stream = tokio::select! {
        s = client.watch(key, Some(wopts)) => s,
        _ = shutdown.changed() => return WatchEnd::Shutdown,
    };
    let stream = match stream {
        Ok(s) => s,
        Err(e) => return WatchEnd::Broken(e.to_string()),
    };
    metrics.upstream_watch(1);
    let _guard = Gauge(metrics);
    let (mut sender, mut responses) = stream.split();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return WatchEnd::Shutdown,
            c = ctl.recv() => match c {
                None => return WatchEnd::Shutdown,
                Some(ReflectorCtl::Progress) => {
                    metrics.count_upstream_request("progress");
                    if let Err(e) = sender.request_progress().await {
                        return WatchEnd::Broken(e.to_string());
                    }
                }
                Some(ReflectorCtl::Relist(reason)) => return WatchEnd::RelistAsked(reason),
            },
            m = responses.message() => {
                let resp = match m {
                    Ok(Some(r)) => r,
                    Ok(None) => return WatchEnd::Broken("etcd ended the watch stream".into()),
                    Err(e) => return WatchEnd::Broken(e.to_string()),
                };
                if resp.compact_revision() > 0 {
                    return WatchEnd::Compacted(resp.compact_revision());
                }
                if resp.canceled() {
                    return WatchEnd::Broken(format!("etcd canceled the watch: {}", resp.cancel_reason()));
                }
                if let Some(h) = resp.header() {
                    upstream.note_header(h.cluster_id(), h.member_id(), h.raft_term());
                }
                if resp.created() {
                    continue;
                }
                if resp.events().is_empty() {
                    // A progress notification: everything up to this revision has been sent.
                    if let Some(h) = resp.header() {
                        let rev = h.revision().max(0) as u64;
                        if rev + 1 >= *next {
                            *next = rev + 1;
                            if cache.send(StorageMsg::Progress { rv: rev }).await.is_err() {
                                return WatchEnd::Shutdown;
                            }
                        }
                    }
                    continue;
                }
                for (rev, changes) in revisions_of(resp.events()) {
                    if rev < *next {
                        // Already applied (a re-watch can overlap); never apply twice.
                        continue;
                    }
                    *next = rev + 1;
                    if cache.send(StorageMsg::Revision { rv: rev, changes }).await.is_err() {
                        return WatchEnd::Shutdown;
                    }
                }
            }
        }
    }
}

struct Gauge<'a>(&'a HostMetrics);

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.upstream_watch(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_from_kubernetes_json() {
        let a = attrs_of(br#"{"metadata":{"name":"p","namespace":"ns","labels":{"app":"web"}},"spec":{"nodeName":"n1"}}"#)
            .expect("attrs");
        assert_eq!(a.label("app"), Some("web"));
        assert_eq!(a.field("metadata.name"), Some("p"));
        assert_eq!(a.field("metadata.namespace"), Some("ns"));
        assert_eq!(a.field("spec.nodeName"), Some("n1"));
        assert!(attrs_of(b"plain value").is_none());
        assert!(attrs_of(b"{not json").is_none());
        assert!(attrs_of(b"{}").is_none());
    }
}
