//! The reflector of one prefix: a paginated list at one revision, then one watch from there
//! with progress notify; progress requests when the core asks; a re-watch from the last
//! revision when the watch breaks (etcd restarting), and a relist when etcd has compacted past
//! it or the core asks. Objects' labels and fields are read once here, from JSON values'
//! `metadata`. Its channel to the cache is bounded: while the cache is behind, the reflector
//! stops reading etcd's watch stream, and HTTP/2 flow control slows etcd's sending. Its watch
//! requires a leader: when etcd ends it for want of one, the upstream is marked leaderless
//! until a watch is created again ([`Upstream::no_leader`]).
//!
//! Kubernetes counterparts: `client-go/tools/cache/reflector.go` (`ListAndWatch`, the
//! resume-from-last-RV rule, backoff) as the cacher drives it in `cacher.go` (`startCaching`),
//! with `storage/etcd3/watcher.go` for the etcd side (`WithProgressNotify`, `WithCreatedNotify`).

use std::sync::Arc;
use std::time::Duration;

use cacher_core::{Attrs, Change, Key, Object};
use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::cache::{ReflectorCtl, StorageMsg};
use crate::config::ReflectorOptions;
use crate::keys::prefix_range;
use crate::metrics::HostMetrics;
use crate::upstream::{is_token_refusal, Upstream, NO_LEADER};

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
        let (rev, mut live) = match sync(&prefix, &upstream, &metrics, &opts).await {
            Ok((msg, stream)) => {
                let rev = match &msg {
                    StorageMsg::Backfill { rv, revisions, objects, seen, .. } => {
                        debug!(prefix = %name, list_revision = rv, revisions = revisions.len(), objects = objects.len(), "listed with the recent history");
                        (*seen).max(*rv)
                    }
                    StorageMsg::Replace { rv, objects, .. } => {
                        debug!(prefix = %name, revision = rv, objects = objects.len(), "listed");
                        *rv
                    }
                    _ => 0,
                };
                if cache.send(msg).await.is_err() {
                    return;
                }
                backoff = opts.backoff_min;
                (rev, stream)
            }
            Err(e) => {
                // A member without a leader times a list out rather than saying so: it is
                // asked with the require-leader flag.
                let leader_error = if e.contains(NO_LEADER) {
                    e.clone()
                } else {
                    leader_probe(&upstream, &prefix).await.err().unwrap_or_default()
                };
                upstream.note_outage();
                if is_token_refusal(&e) {
                    upstream.refresh_tokens().await;
                }
                note_leader(&upstream, &leader_error, &mut backoff, &opts);
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
                live.take(),
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
                    upstream.note_outage();
                    if is_token_refusal(&e) {
                        upstream.refresh_tokens().await;
                    }
                    note_leader(&upstream, &e, &mut backoff, &opts);
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

/// A read of one key with etcd's require-leader flag: a member without a leader refuses it at
/// once with `etcdserver: no leader`.
async fn leader_probe(upstream: &Upstream, prefix: &[u8]) -> Result<(), String> {
    let opts = GetOptions::new().with_count_only().with_serializable();
    let mut kv = upstream.watcher().kv_client();
    kv.get(crate::keys::probe_key(prefix), Some(opts)).await.map(|_| ()).map_err(|e| e.to_string())
}

/// etcd ended or refused the cache's require-leader watch (or read) because its member has no
/// leader: the server's require-leader clients get the same answer until a watch is created
/// again, and the reflector tries again at its shortest interval (etcd refuses at once while
/// it has no leader, and the leader's return should be seen soon).
fn note_leader(upstream: &Upstream, error: &str, backoff: &mut Duration, opts: &ReflectorOptions) {
    if error.contains(NO_LEADER) {
        upstream.set_no_leader(true);
    }
    if upstream.no_leader() {
        *backoff = opts.backoff_min;
    }
}

async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}

/// The cache's starting point. With `backfill_revisions` (the default) it is the state at a
/// revision S up to that many revisions back, plus etcd's history from S to its current
/// revision, handed to the cache in one piece: the cache then opens with a window over the
/// recent past, so that watchers resuming from a revision still in etcd's history (after a
/// restart of watchcache, or a relist) are served from memory instead of each going to etcd.
/// Without it (0: Kubernetes' own behaviour) it is a list at the current revision.
///
/// The history comes first and the list at S last: etcd replays an unsynced watcher's history
/// 1 000 revisions per 100 ms round, so a list made first would be a second or more old when
/// the cache opens, and watchers resuming at once would wait for a compaction probe; the list's
/// answer, last, says that etcd still has S as the cache starts serving (`CompactionGate`).
///
/// Cost on etcd: one count-free read of one key (the current revision), one watch replaying at
/// most `backfill_revisions` revisions of the prefix from etcd's history (it goes on as the
/// live watch), and one paginated list at S (as costly as a list now); when S is compacted,
/// etcd's cancel of the history watch names the compaction revision, and one more watch starts
/// there.
async fn sync(
    prefix: &[u8],
    upstream: &Upstream,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
) -> Result<(StorageMsg, Option<UpWatch>), String> {
    if opts.backfill_revisions == 0 {
        let (rv, objects, listed_at) =
            list(prefix, upstream, metrics, opts, 0).await.map_err(|e| e.0)?;
        return Ok((StorageMsg::Replace { rv, objects, listed_at }, None));
    }
    metrics.count_upstream_request("quorum_read");
    let now = upstream.current_revision(prefix).await?;
    let mut at = now.saturating_sub(opts.backfill_revisions).max(1);
    if at >= now {
        let (rv, objects, listed_at) =
            list(prefix, upstream, metrics, opts, at).await.map_err(|e| e.0)?;
        return Ok((StorageMsg::Replace { rv, objects, listed_at }, None));
    }
    let (mut revisions, seen, stream) = match history(prefix, upstream, metrics, opts, at + 1, now)
        .await
    {
        Ok(h) => h,
        Err(HistoryError::Compacted(c)) => {
            // S is compacted: etcd's compaction revision is where history starts.
            debug!(compacted = c, "the backfill's start is compacted; starting at the compaction");
            at = c.max(at);
            history(prefix, upstream, metrics, opts, at + 1, now).await.map_err(|e| e.text())?
        }
        Err(HistoryError::Failed(e)) => return Err(e),
    };
    let (rv, objects, listed_at) = match list(prefix, upstream, metrics, opts, at).await {
        Ok(x) => x,
        Err(ListError(e, true)) => {
            // Compacted past S since the history came: the list at the compaction revision,
            // and the history after it.
            metrics.count_upstream_request("watch");
            let compacted = upstream.compaction_revision(prefix, at).await?;
            debug!(error = %e, compacted, "the backfill's start was compacted meanwhile");
            at = compacted.max(at);
            list(prefix, upstream, metrics, opts, at).await.map_err(|e| e.0)?
        }
        Err(ListError(e, false)) => return Err(e),
    };
    revisions.retain(|(r, _)| *r > rv);
    Ok((StorageMsg::Backfill { rv, objects, listed_at, revisions, seen }, Some(stream)))
}

/// Why etcd's history did not come.
enum HistoryError {
    /// etcd compacted it: its compaction revision.
    Compacted(u64),
    Failed(String),
}

impl HistoryError {
    fn text(self) -> String {
        match self {
            HistoryError::Compacted(c) => format!("etcd compacted the history at {c}"),
            HistoryError::Failed(e) => e,
        }
    }
}

impl From<String> for HistoryError {
    fn from(e: String) -> HistoryError {
        HistoryError::Failed(e)
    }
}

impl From<&str> for HistoryError {
    fn from(e: &str) -> HistoryError {
        HistoryError::Failed(e.to_owned())
    }
}

/// etcd's history of the prefix from `from` through at least `until`, whole revisions, the
/// revision up to which it is complete, and the watch itself (it goes on as the live watch:
/// one etcd watch per list).
async fn history(
    prefix: &[u8],
    upstream: &Upstream,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
    from: u64,
    until: u64,
) -> Result<(Vec<(u64, Vec<Change>)>, u64, UpWatch), HistoryError> {
    let UpWatch { tx: mut sender, rx: mut stream, mut main_id } =
        open_watch(prefix, upstream, metrics, opts, from).await?;
    let mut out: Vec<(u64, Vec<Change>)> = Vec::new();
    let mut seen = from.saturating_sub(1);
    // etcd drops a progress request while the watcher is still catching up: ask every 100 ms
    // until it answers (an idle prefix has no events to show that `until` is reached).
    let mut ask = tokio::time::interval(Duration::from_millis(100));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen < until {
        let m = tokio::select! {
            _ = ask.tick() => {
                metrics.count_upstream_request("progress");
                sender.request_progress().await.map_err(|e| e.to_string())?;
                continue;
            }
            _ = tokio::time::sleep_until(deadline) => return Err("etcd's history did not arrive in 60 s".into()),
            m = stream.message() => m,
        };
        let resp = m.map_err(|e| e.to_string())?.ok_or("etcd closed the history watch")?;
        if resp.compact_revision() > 0 {
            return Err(HistoryError::Compacted(resp.compact_revision() as u64));
        }
        if resp.canceled() {
            return Err(format!("etcd canceled the history watch: {}", resp.cancel_reason()).into());
        }
        if resp.created() {
            main_id = Some(resp.watch_id());
            upstream.set_no_leader(false);
            continue;
        }
        if resp.events().is_empty() {
            if let Some(h) = resp.header() {
                seen = seen.max(h.revision().max(0) as u64);
            }
            continue;
        }
        for (rev, changes) in revisions_of(resp.events()) {
            if rev > seen {
                seen = rev;
                out.push((rev, changes));
            }
        }
    }
    Ok((out, seen, UpWatch { tx: sender, rx: stream, main_id }))
}

/// An open etcd watch: its request and response halves, and the prefix watcher's id once its
/// `created` answer was read.
struct UpWatch {
    tx: etcd_client::WatchRequestSender,
    rx: etcd_client::WatchResponseStream,
    main_id: Option<i64>,
}

/// The reflector's watch of the prefix from `from`, with progress notify and etcd's
/// require-leader flag (as kube-apiserver's `watcher.go` asks for its watches: the member ends
/// it after three election timeouts without a leader, which the reflector notes for the server).
async fn open_watch(
    prefix: &[u8],
    upstream: &Upstream,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
    from: u64,
) -> Result<UpWatch, String> {
    let (key, end) = prefix_range(prefix);
    let wopts =
        WatchOptions::new().with_range(end).with_start_revision(from as i64).with_progress_notify();
    metrics.count_upstream_request("watch");
    let mut client =
        upstream.watcher().watch_client().max_decoding_message_size(opts.max_message_bytes);
    let (tx, rx) = client.watch(key, Some(wopts)).await.map_err(|e| e.to_string())?.split();
    Ok(UpWatch { tx, rx, main_id: None })
}

/// A failed list, and whether etcd said the revision is compacted.
struct ListError(String, bool);

/// A paginated list of the prefix at one revision (0 = the current one): the revision, the
/// objects, and when the last page was asked for (etcd still had the revision then).
async fn list(
    prefix: &[u8],
    upstream: &Upstream,
    metrics: &HostMetrics,
    opts: &ReflectorOptions,
    at: u64,
) -> Result<(u64, Vec<Object>, tokio::time::Instant), ListError> {
    let (start, end) = prefix_range(prefix);
    let mut kv = upstream.client.kv_client().max_decoding_message_size(opts.max_message_bytes);
    let mut key = start;
    let mut rev = at as i64;
    let mut objects = Vec::new();
    let mut asked;
    loop {
        let mut o = GetOptions::new().with_range(end.clone()).with_limit(opts.page_size);
        if rev > 0 {
            o = o.with_revision(rev);
        }
        metrics.count_upstream_request("list");
        asked = tokio::time::Instant::now();
        let mut resp = kv.get(key.clone(), Some(o)).await.map_err(|e| {
            let text = e.to_string();
            let compacted = text.contains("required revision has been compacted");
            ListError(text, compacted)
        })?;
        if rev == 0 {
            let h = resp
                .header()
                .ok_or_else(|| ListError("no header in etcd's list answer".into(), false))?;
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
    Ok((rev.max(0) as u64, objects, asked))
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
    open: Option<UpWatch>,
) -> WatchEnd {
    let UpWatch { tx: mut sender, rx: mut responses, mut main_id } = match open {
        Some(w) => w,
        None => {
            let stream = tokio::select! {
                s = open_watch(prefix, upstream, metrics, opts, *next) => s,
                _ = shutdown.changed() => return WatchEnd::Shutdown,
            };
            match stream {
                Ok(s) => s,
                Err(e) => return WatchEnd::Broken(e),
            }
        }
    };
    metrics.upstream_watch(1);
    let _guard = Gauge(metrics);
    let mut probes = RevisionProbes::new(prefix);
    // The prefix watch's id comes with its `created` answer, the stream's first (etcd answers
    // create requests in order, and that one was sent first; `history` may have read it):
    // probes are sent only once it is known, so no probe's answer is taken for it.
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
                Some(ReflectorCtl::Revision(reply)) if main_id.is_some() => {
                    if let Err(e) = probes.ask(&mut sender, reply, metrics).await {
                        return WatchEnd::Broken(e);
                    }
                }
                // Not yet: the cache falls back to a quorum read.
                Some(ReflectorCtl::Revision(_)) => {}
            },
            m = responses.message() => {
                let resp = match m {
                    Ok(Some(r)) => r,
                    Ok(None) => return WatchEnd::Broken("etcd ended the watch stream".into()),
                    Err(e) => return WatchEnd::Broken(e.to_string()),
                };
                if main_id.is_some() && (resp.created() || resp.watch_id() >= PROBE_IDS) {
                    // A revision probe's answer (its `created`, or the ack of its cancel).
                    if let Err(e) = probes.answer(&mut sender, &resp, metrics).await {
                        return WatchEnd::Broken(e);
                    }
                    continue;
                }
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
                    main_id = Some(resp.watch_id());
                    // etcd creates a require-leader watch only with a leader.
                    upstream.set_no_leader(false);
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

/// The first revision probe's watch id: etcd numbers a stream's watchers from 0, so its own
/// ids never reach this range.
const PROBE_IDS: i64 = 1 << 40;

/// Revision probes on the reflector's stream: a watcher of the prefix key from "now", whose
/// `created` answer carries the member's current revision (read after the request arrived, so
/// it covers every write the member acknowledged before), cancelled as soon as it answers.
/// One is out at a time.
struct RevisionProbes {
    key: Vec<u8>,
    next_id: i64,
    /// The probe out, and who waits for it.
    out: Option<(i64, oneshot::Sender<Result<u64, String>>)>,
    queued: std::collections::VecDeque<oneshot::Sender<Result<u64, String>>>,
}

impl RevisionProbes {
    fn new(prefix: &[u8]) -> RevisionProbes {
        RevisionProbes {
            key: crate::keys::probe_key(prefix),
            next_id: PROBE_IDS,
            out: None,
            queued: Default::default(),
        }
    }

    async fn ask(
        &mut self,
        sender: &mut etcd_client::WatchRequestSender,
        reply: oneshot::Sender<Result<u64, String>>,
        metrics: &HostMetrics,
    ) -> Result<(), String> {
        self.queued.push_back(reply);
        self.send_next(sender, metrics).await
    }

    async fn send_next(
        &mut self,
        sender: &mut etcd_client::WatchRequestSender,
        metrics: &HostMetrics,
    ) -> Result<(), String> {
        // A probe nobody waits for any more (the cache gave up on it) does not hold the
        // others: its answer, when it comes, is only cancelled.
        if self.out.as_ref().is_some_and(|(_, reply)| reply.is_closed()) {
            self.out = None;
        }
        if self.out.is_some() {
            return Ok(());
        }
        while let Some(reply) = self.queued.pop_front() {
            if reply.is_closed() {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            metrics.count_upstream_request("revision_probe");
            sender
                .watch(self.key.clone(), Some(WatchOptions::new().with_watch_id(id)))
                .await
                .map_err(|e| e.to_string())?;
            self.out = Some((id, reply));
            break;
        }
        Ok(())
    }

    async fn answer(
        &mut self,
        sender: &mut etcd_client::WatchRequestSender,
        resp: &etcd_client::WatchResponse,
        metrics: &HostMetrics,
    ) -> Result<(), String> {
        if !resp.created() {
            return Ok(()); // a cancel's ack, or an event on the probe's key: not needed
        }
        let wid = resp.watch_id();
        match self.out.take() {
            Some((id, reply)) if wid == id && !resp.canceled() => {
                let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
                let _ =
                    reply.send(if rev > 0 { Ok(rev as u64) } else { Err("no revision".into()) });
                sender.cancel(id).await.map_err(|e| e.to_string())?;
            }
            Some((id, reply)) if resp.canceled() && (wid == id || wid == -1) => {
                // etcd refused the watcher (e.g. no permission on the key): the cache falls
                // back to a quorum read.
                let reason = resp.cancel_reason();
                let _ = reply.send(Err(format!("etcd refused a revision probe: {reason}")));
            }
            other => {
                // An abandoned probe's answer: end its watcher.
                self.out = other;
                if !resp.canceled() && wid >= PROBE_IDS {
                    sender.cancel(wid).await.map_err(|e| e.to_string())?;
                }
                return Ok(());
            }
        }
        self.send_next(sender, metrics).await
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
