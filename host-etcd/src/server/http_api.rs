//! The HTTP side: `/metrics`, `/healthz`, `/readyz`, `/debug/state`, the Kubernetes-style list
//! and watch API under `/kube/…` (newline-delimited JSON, Kubernetes semantics and errors), and
//! the web demo's static files.
//!
//! Kubernetes counterparts: the apiserver's list/watch handlers as they reach the cacher
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go`, `watch.go`): query
//! parameters, `metav1.Status` errors with their HTTP codes, `Retry-After`, watch events as
//! `{"type":…,"object":…}`, bookmarks with the `k8s.io/initial-events-end` annotation.
//! What the cacher sends to storage is served here from etcd directly, as the etcd3 store
//! (`storage/etcd3/store.go`, `watcher.go`) would.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use cacher_core::{
    continue_token, GetRequest, KeyRange, ListRequest, Object, ReadOutcome, Reason, RvMatch,
    RvParam, Selector, Status, WatchEvent, WatchRequest,
};
use etcd_client::proto::{PbAuthenticateRequest, PbAuthenticateResponse};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tonic::metadata::{MetadataMap, MetadataValue};

use super::Ctx;
use crate::cache::CoreItem;
use crate::keys::etcd_range;
use crate::session::driver::UpstreamWatchGauge;

/// The HTTP router.
pub(crate) fn router(ctx: Arc<Ctx>, web_dir: Option<std::path::PathBuf>) -> Router {
    let r = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/state", get(debug_state))
        .route("/kube/{*path}", get(kube))
        .with_state(ctx);
    match web_dir {
        Some(dir) if dir.is_dir() => r.fallback_service(tower_http::services::ServeDir::new(dir)),
        _ => r,
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ctx): State<Arc<Ctx>>) -> Response {
    let mut lines = Vec::new();
    let mut ok = true;
    for c in ctx.caches() {
        let s = c.status();
        ok &= s.ready;
        lines.push(format!(
            "[{}] cache {:?}: {}",
            if s.ready { "+" } else { "-" },
            c.prefix_str(),
            if s.ready {
                format!("ready at revision {}", s.rv)
            } else {
                format!("not ready: {}", s.last_error.unwrap_or_else(|| "initialising".into()))
            }
        ));
    }
    lines.push(if ok { "readyz check passed".into() } else { "readyz check failed".into() });
    let code = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, lines.join("\n") + "\n").into_response()
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    let mut samples = Vec::new();
    for c in ctx.caches() {
        if let Some(s) = c.sample().await {
            samples.push(s);
        }
    }
    let text = super::prometheus::render(samples, ctx.metrics());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

async fn debug_state(State(ctx): State<Arc<Ctx>>) -> Response {
    let mut caches = Vec::new();
    for c in ctx.caches() {
        caches.push(c.debug_state().await);
    }
    let (wc, we) = ctx.metrics().watches();
    let (rc, re) = ctx.metrics().ranges();
    let body = json!({
        "caches": caches,
        "host": {
            "grpc_watchers": ctx.metrics().grpc_watchers(),
            "upstream_watches": ctx.metrics().upstream_watches(),
            "watches": {"cache": wc, "etcd": we},
            "ranges": {"cache": rc, "etcd": re},
            "compacted_revision": ctx.compacted(),
            "auth_enabled": ctx.auth.enabled(),
        },
    });
    axum::Json(body).into_response()
}

// ----- the Kubernetes-style API ------------------------------------------------------------

fn status_json(s: &Status) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": s.message, "reason": s.reason.as_str(), "code": s.code(),
    });
    if let Some(r) = s.retry_after_s {
        v["details"] = json!({"retryAfterSeconds": r});
    }
    v
}

fn error_response(s: &Status) -> Response {
    let code = StatusCode::from_u16(s.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (code, axum::Json(status_json(s))).into_response();
    if let Some(r) = s.retry_after_s {
        if let Ok(v) = HeaderValue::from_str(&r.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

fn bad(msg: impl Into<String>) -> Response {
    error_response(&Status::bad_request(msg))
}

/// An object as the API shows it: a JSON object value with `metadata.resourceVersion` set;
/// any other value wrapped with its key as the name.
fn object_json(o: &Object, rv: u64) -> Value {
    let value = o.value().unwrap_or_default();
    if let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(value) {
        let meta = m.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        return Value::Object(m);
    }
    json!({
        "apiVersion": "v1", "kind": "Value",
        "metadata": {"name": String::from_utf8_lossy(o.key()), "resourceVersion": rv.to_string()},
        "value": String::from_utf8_lossy(value),
    })
}

fn event_line(e: &WatchEvent) -> Option<Bytes> {
    let v = match e {
        WatchEvent::Bookmark { rv, initial_events_end } => {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if *initial_events_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            json!({"type": "BOOKMARK", "object": {"kind": "Bookmark", "apiVersion": "v1", "metadata": meta}})
        }
        other => {
            let o = other.object()?;
            json!({"type": other.type_str(), "object": object_json(o, other.rv())})
        }
    };
    let mut line = serde_json::to_vec(&v).ok()?;
    line.push(b'\n');
    Some(Bytes::from(line))
}

fn error_line(s: &Status) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": "ERROR", "object": status_json(s)})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// The etcd credentials of an HTTP client (when etcd has auth on): `Authorization: Bearer
/// <etcd token>` or `Basic` with an etcd user and password.
#[allow(clippy::result_large_err)]
async fn credentials(ctx: &Ctx, headers: &HeaderMap) -> Result<MetadataMap, Response> {
    let mut md = MetadataMap::new();
    if !ctx.auth.enabled() {
        return Ok(md);
    }
    let unauthorized = |m: &str| {
        let mut r = error_response(&Status::new(Reason::BadRequest, m.to_owned()));
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        r
    };
    let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Err(unauthorized("etcd auth is enabled: send Authorization: Bearer <etcd token> or Basic <user:password>"));
    };
    let token = if let Some(t) = auth.strip_prefix("Bearer ") {
        t.trim().to_owned()
    } else if let Some(b) = auth.strip_prefix("Basic ") {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .map_err(|_| unauthorized("bad Basic credentials"))?;
        let text = String::from_utf8(decoded).map_err(|_| unauthorized("bad Basic credentials"))?;
        let (name, password) =
            text.split_once(':').ok_or_else(|| unauthorized("bad Basic credentials"))?;
        let req = PbAuthenticateRequest { name: name.to_owned(), password: password.to_owned() };
        ctx.metrics().count_upstream_request("authenticate");
        let r = ctx
            .upstream()
            .unary::<PbAuthenticateRequest, PbAuthenticateResponse>(
                "/etcdserverpb.Auth/Authenticate",
                &MetadataMap::new(),
                req,
            )
            .await
            .map_err(|s| unauthorized(s.message()))?;
        r.into_inner().token
    } else {
        return Err(unauthorized("unsupported Authorization scheme"));
    };
    let v = MetadataValue::try_from(token.as_str()).map_err(|_| unauthorized("bad token"))?;
    md.insert("token", v);
    Ok(md)
}

#[allow(clippy::result_large_err)]
fn parse_bool(q: &HashMap<String, String>, name: &str) -> Result<Option<bool>, Response> {
    match q.get(name).map(String::as_str) {
        None | Some("") => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0") => Ok(Some(false)),
        Some(other) => Err(bad(format!("{name}: Invalid value: {other:?}: must be true or false"))),
    }
}

async fn kube(
    State(ctx): State<Arc<Ctx>>,
    Path(path): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let key = format!("/{path}");
    let recursive =
        key.ends_with('/') || parse_bool(&q, "recursive").ok().flatten().unwrap_or(false);
    let range = match KeyRange::kubernetes(&key, recursive) {
        Ok(r) => r,
        Err(s) => return error_response(&s),
    };
    let Some(ci) = ctx.cache_for(&range) else {
        return error_response(&Status::new(
            Reason::NotFound,
            format!("no cached prefix holds {key:?}"),
        ));
    };
    let md = match credentials(&ctx, &headers).await {
        Ok(md) => md,
        Err(r) => return r,
    };
    let (k, end) = etcd_range(&range);
    if let Err(s) = ctx.auth.check(&md, &k, &end).await {
        let mut r = error_response(&Status::new(Reason::BadRequest, s.message().to_owned()));
        *r.status_mut() = StatusCode::FORBIDDEN;
        return r;
    }
    let rv = match RvParam::parse(q.get("resourceVersion").map(String::as_str).unwrap_or("")) {
        Ok(rv) => rv,
        Err(s) => return error_response(&s),
    };
    let selector = match Selector::parse(
        q.get("labelSelector").map(String::as_str).unwrap_or(""),
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
    ) {
        Ok(s) => s,
        Err(s) => return error_response(&s),
    };
    let watch = match parse_bool(&q, "watch") {
        Ok(w) => w.unwrap_or(false),
        Err(r) => return r,
    };
    if watch {
        let mut req = WatchRequest::new(range, rv);
        req.selector = selector;
        req.allow_bookmarks = match parse_bool(&q, "allowWatchBookmarks") {
            Ok(b) => b.unwrap_or(false),
            Err(r) => return r,
        };
        req.send_initial_events = match parse_bool(&q, "sendInitialEvents") {
            Ok(b) => b,
            Err(r) => return r,
        };
        if let Some(t) = q.get("timeoutSeconds") {
            match t.parse::<u64>() {
                Ok(t) => req.timeout_ms = Some(t.saturating_mul(1000)),
                Err(_) => return bad(format!("timeoutSeconds: Invalid value: {t:?}")),
            }
        }
        return kube_watch(ctx, ci, md, req).await;
    }
    let limit = match q.get("limit").map(|l| l.parse::<i64>()) {
        None => 0,
        Some(Ok(l)) if l >= 0 => l as u64,
        Some(_) => return bad("limit: Invalid value: must be a non-negative integer"),
    };
    let rv_match =
        match RvMatch::parse(q.get("resourceVersionMatch").map(String::as_str).unwrap_or("")) {
            Ok(m) => m,
            Err(s) => return error_response(&s),
        };
    if let KeyRange::Exact(k) = &range {
        let outcome = ctx.caches()[ci].get(GetRequest { key: k.clone(), rv }).await;
        return match outcome {
            Ok(ReadOutcome::Cache(read)) => match read.items.first() {
                Some(o) => axum::Json(object_json(o, o.rv())).into_response(),
                None => error_response(&Status::not_found(k.as_bytes())),
            },
            Ok(ReadOutcome::Storage { .. }) => storage_get(&ctx, &md, k.as_bytes(), rv).await,
            Err(s) => error_response(&s),
        };
    }
    let mut req = ListRequest::new(range.clone(), rv);
    req.rv_match = rv_match;
    req.limit = limit;
    req.continue_token = q.get("continue").cloned().filter(|c| !c.is_empty());
    req.selector = selector.clone();
    match ctx.caches()[ci].list(req.clone()).await {
        Ok(ReadOutcome::Cache(read)) => {
            list_response(read.rv, read.items, read.continue_token, read.remaining)
        }
        Ok(ReadOutcome::Storage { .. }) => storage_list(&ctx, &md, &req).await,
        Err(s) => error_response(&s),
    }
}

/// A list response, streamed item by item (never one big buffer).
fn list_response(
    rv: u64,
    items: Vec<Arc<Object>>,
    cont: Option<String>,
    remaining: Option<u64>,
) -> Response {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = &cont {
        meta["continue"] = Value::String(c.clone());
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    let head = format!("{{\"kind\":\"List\",\"apiVersion\":\"v1\",\"metadata\":{meta},\"items\":[");
    let n = items.len();
    let body = futures::stream::iter(std::iter::once(Bytes::from(head)).chain(
        items.into_iter().enumerate().map(move |(i, o)| {
            let mut b = serde_json::to_vec(&object_json(&o, o.rv())).unwrap_or_default();
            if i + 1 < n {
                b.push(b',');
            }
            Bytes::from(b)
        }),
    ))
    .chain(futures::stream::once(async { Bytes::from_static(b"]}\n") }))
    .map(Ok::<_, std::convert::Infallible>);
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

async fn storage_get(ctx: &Ctx, md: &MetadataMap, key: &[u8], rv: RvParam) -> Response {
    use etcd_client::proto::{PbRangeRequest, PbRangeResponse};
    // The etcd3 store reads the latest state for a get (and checks it is not older than rv).
    let _ = rv;
    let req = PbRangeRequest { key: key.to_vec(), ..Default::default() };
    ctx.metrics().count_upstream_request("range");
    match ctx
        .upstream()
        .unary::<PbRangeRequest, PbRangeResponse>("/etcdserverpb.KV/Range", md, req)
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            match r.kvs.first() {
                Some(kv) => {
                    let o = Object::new(&kv.key, Some(&kv.value), kv.mod_revision.max(0) as u64);
                    axum::Json(object_json(&o, o.rv())).into_response()
                }
                None => error_response(&Status::not_found(key)),
            }
        }
        Err(s) => error_response(&etcd_status(&s)),
    }
}

fn etcd_status(s: &tonic::Status) -> Status {
    if s.message().contains("required revision has been compacted") {
        return Status::new(
            Reason::Expired,
            "The resourceVersion for the provided list is too old.",
        );
    }
    Status::new(Reason::InternalError, s.message().to_owned())
}

/// A list etcd answers (what the cacher delegates): one page at one revision, filtered by the
/// selector, as the etcd3 store does.
async fn storage_list(ctx: &Ctx, md: &MetadataMap, req: &ListRequest) -> Response {
    use etcd_client::proto::{PbRangeRequest, PbRangeResponse};
    let KeyRange::Prefix(prefix) = &req.range else { return bad("not a list") };
    let prefix = prefix.as_bytes();
    let (_, end) = crate::keys::prefix_range(prefix);
    let (mut start, mut revision) = (prefix.to_vec(), 0i64);
    if let Some(c) = &req.continue_token {
        match continue_token::decode(c, prefix) {
            Ok(t) => {
                start = t.start_key;
                revision = t.rv.max(0);
            }
            Err(s) => return error_response(&s),
        }
    } else if let (RvParam::At(n), Some(RvMatch::Exact)) = (req.rv, req.rv_match) {
        revision = n as i64;
    }
    let mut items: Vec<Arc<Object>> = Vec::new();
    let mut list_rev = revision;
    let mut next_key: Option<Vec<u8>> = None;
    loop {
        let limit = if req.limit > 0 { (req.limit as i64 - items.len() as i64).max(1) } else { 0 };
        let r = PbRangeRequest {
            key: start.clone(),
            range_end: end.clone(),
            revision,
            limit,
            ..Default::default()
        };
        ctx.metrics().count_upstream_request("range");
        let resp: PbRangeResponse =
            match ctx.upstream().unary("/etcdserverpb.KV/Range", md, r).await {
                Ok(r) => r.into_inner(),
                Err(s) => return error_response(&etcd_status(&s)),
            };
        if list_rev == 0 {
            list_rev = resp.header.as_ref().map_or(0, |h| h.revision);
            revision = list_rev;
        }
        let more = resp.more;
        let last = resp.kvs.last().map(|kv| kv.key.clone());
        for kv in resp.kvs {
            let mut o = Object::new(&kv.key, Some(&kv.value), kv.mod_revision.max(0) as u64);
            if let Some(a) = crate::reflector::attrs_of(&kv.value) {
                o = o.with_attrs(a);
            }
            if req.selector.matches(&o) {
                items.push(Arc::new(o));
            }
        }
        match last {
            Some(mut k) if more => {
                k.push(0);
                if req.limit > 0 && items.len() as u64 >= req.limit {
                    next_key = Some(k);
                    break;
                }
                start = k;
            }
            _ => break,
        }
    }
    let cont = next_key.and_then(|k| continue_token::encode(&k, prefix, list_rev.max(0) as u64));
    list_response(list_rev.max(0) as u64, items, cont, None)
}

async fn kube_watch(ctx: Arc<Ctx>, ci: usize, md: MetadataMap, req: WatchRequest) -> Response {
    let cache = ctx.caches()[ci].clone();
    let (id, mut items) = match cache.core_watch(req.clone()).await {
        Ok(x) => x,
        Err(s) => return error_response(&s),
    };
    // The first item says how the watch starts.
    let first = items.recv().await;
    match first {
        Some(CoreItem::Started) => {}
        Some(CoreItem::Rejected(s)) => return error_response(&s),
        Some(CoreItem::Delegated(_)) => return storage_watch(ctx, md, req).await,
        Some(CoreItem::Error(s)) => {
            // An ERROR item as the first thing on a 200 stream, as the cacher does.
            let body =
                futures::stream::once(
                    async move { Ok::<_, std::convert::Infallible>(error_line(&s)) },
                );
            return ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body))
                .into_response();
        }
        _ => {
            return error_response(&Status::new(
                Reason::InternalError,
                "watch ended before it started",
            ))
        }
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _cancel = CancelOnDrop(cache.clone(), id);
        loop {
            // A client that went away ends the watch at once, not at its next event.
            let item = tokio::select! {
                item = items.recv() => item,
                _ = tx.closed() => return,
            };
            let Some(item) = item else { return };
            match item {
                CoreItem::Events(events) => {
                    let n = events.len() as u64;
                    for e in &events {
                        if let Some(line) = event_line(e) {
                            if tx.send(line).await.is_err() {
                                return;
                            }
                        }
                    }
                    cache.credit(id, n);
                }
                CoreItem::Error(s) => {
                    if tx.send(error_line(&s)).await.is_err() {
                        return;
                    }
                }
                CoreItem::Closed(_) | CoreItem::Rejected(_) | CoreItem::Delegated(_) => return,
                CoreItem::Started => {}
            }
        }
    });
    let body =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

struct CancelOnDrop(crate::cache::CacheHandle, cacher_core::RequestId);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel(self.1);
    }
}

/// A watch the cacher sends to storage: etcd's watch from the given revision, with selector
/// transitions as the etcd3 watcher computes them.
async fn storage_watch(ctx: Arc<Ctx>, md: MetadataMap, req: WatchRequest) -> Response {
    use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion};
    let (key, end) = etcd_range(&req.range);
    let start = match req.rv {
        RvParam::At(n) => n as i64 + 1,
        _ => 0,
    };
    ctx.metrics().count_upstream_request("watch");
    let mut create = PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    };
    if let Some(PbWatchRequestUnion::CreateRequest(c)) = create.request_union.as_mut() {
        c.key = key;
        c.range_end = end;
        c.start_revision = start;
        c.prev_kv = true;
        c.progress_notify = req.allow_bookmarks;
    }
    let opened = ctx.upstream().relay_watch(&md, 4, create).await;
    let (up_tx, mut stream) = match opened {
        Ok(x) => x,
        Err(s) => return error_response(&etcd_status(&s)),
    };
    let selector = req.selector.clone();
    let timeout = req.timeout_ms.map(Duration::from_millis);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let metrics = ctx.env.metrics.clone();
    tokio::spawn(async move {
        let _keep = up_tx;
        let _gauge = UpstreamWatchGauge::open(&metrics);
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        loop {
            let m = tokio::select! {
                _ = &mut deadline => break,
                // The client went away: end the upstream watch too.
                _ = tx.closed() => break,
                m = stream.message() => m,
            };
            let Ok(Some(resp)) = m else { break };
            if resp.compact_revision > 0 {
                let s = Status::too_old(start.max(0) as u64, resp.compact_revision.max(0) as u64);
                let _ = tx.send(error_line(&s)).await;
                break;
            }
            if resp.canceled {
                let _ = tx
                    .send(error_line(&Status::new(
                        Reason::InternalError,
                        resp.cancel_reason.clone(),
                    )))
                    .await;
                break;
            }
            if resp.created {
                continue;
            }
            if resp.events.is_empty() {
                if let Some(h) = &resp.header {
                    let e = WatchEvent::Bookmark {
                        rv: h.revision.max(0) as u64,
                        initial_events_end: false,
                    };
                    if let Some(line) = event_line(&e) {
                        if tx.send(line).await.is_err() {
                            break;
                        }
                    }
                }
                continue;
            }
            for ev in &resp.events {
                let Some(kv) = &ev.kv else { continue };
                let obj = |kv: &etcd_client::proto::PbKeyValue| {
                    let o = Object::new(&kv.key, Some(&kv.value), kv.mod_revision.max(0) as u64);
                    match crate::reflector::attrs_of(&kv.value) {
                        Some(a) => o.with_attrs(a),
                        None => o,
                    }
                };
                let prev = ev.prev_kv.as_ref().map(obj);
                let prev_ok = prev.as_ref().is_some_and(|p| selector.matches(p));
                let rev = kv.mod_revision.max(0) as u64;
                let line = if ev.r#type == crate::convert::EVENT_DELETE {
                    prev.filter(|_| prev_ok).map(|p| ("DELETED", object_json(&p, rev)))
                } else {
                    let cur = obj(kv);
                    let cur_ok = selector.matches(&cur);
                    match (prev_ok, cur_ok) {
                        (true, true) => Some(("MODIFIED", object_json(&cur, rev))),
                        (false, true) => Some(("ADDED", object_json(&cur, rev))),
                        (true, false) => Some(("DELETED", object_json(&cur, rev))),
                        (false, false) => None,
                    }
                };
                if let Some((t, o)) = line {
                    let mut b =
                        serde_json::to_vec(&json!({"type": t, "object": o})).unwrap_or_default();
                    b.push(b'\n');
                    if tx.send(Bytes::from(b)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let body =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_get_their_resource_version() {
        let o = Object::new(b"/r/a", Some(br#"{"metadata":{"name":"a"}}"#), 7);
        assert_eq!(object_json(&o, 7)["metadata"]["resourceVersion"], "7");
        let p = Object::new(b"/r/b", Some(b"plain"), 8);
        let v = object_json(&p, 9);
        assert_eq!(v["metadata"]["name"], "/r/b");
        assert_eq!(v["metadata"]["resourceVersion"], "9");
        assert_eq!(v["value"], "plain");
    }

    #[test]
    fn bookmark_lines_carry_the_annotation() {
        let line =
            event_line(&WatchEvent::Bookmark { rv: 5, initial_events_end: true }).expect("line");
        let v: Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["type"], "BOOKMARK");
        assert_eq!(v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "5");
    }
}
