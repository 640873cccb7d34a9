//! The Kubernetes-style HTTP API over the cache: lists with selectors and pagination, watches
//! with Kubernetes semantics (410 ERROR events for too-old resource versions, the annotated
//! bookmark that ends `sendInitialEvents`), and Kubernetes' error bodies.

use crate::support;

use std::time::Duration;

use host_etcd::EtcdOptions;
use serde_json::{json, Value};
use support::Env;

async fn pods(env: &Env, n: usize) -> i64 {
    let mut c = env.direct().await;
    let mut rev = 0;
    for i in 0..n {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": if i % 2 == 0 { "even" } else { "odd" }, "labels": {"app": if i % 3 == 0 { "web" } else { "db" }}},
            "spec": {"nodeName": format!("node{}", i % 4)},
        });
        let ns = if i % 2 == 0 { "even" } else { "odd" };
        rev = c
            .put(format!("/registry/pods/{ns}/p{i}"), pod.to_string(), None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
    }
    rev
}

/// Reads newline-delimited JSON lines from a streaming response until `stop` says so.
async fn lines(
    mut resp: support::http::Response,
    limit: Duration,
    stop: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while !stop(&out) {
        let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Some(Ok(c))) => c,
            _ => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            out.push(serde_json::from_slice(&line).expect("a JSON line"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_with_selectors_and_pages() {
    let env = Env::start().await;
    let rev = pods(&env, 12).await;
    env.wait_cache_rev(rev).await;
    let base = env.http();
    let list: Value =
        support::http::get(format!("{base}/kube/registry/pods/?labelSelector=app%3Dweb"))
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 4);
    assert!(items.iter().all(|p| p["metadata"]["labels"]["app"] == "web"));
    assert_eq!(list["metadata"]["resourceVersion"], rev.to_string());
    let list: Value = support::http::get(format!(
        "{base}/kube/registry/pods/even/?fieldSelector=spec.nodeName%3Dnode2"
    ))
    .await
    .expect("list")
    .json()
    .await
    .expect("json");
    assert_eq!(list["items"].as_array().expect("items").len(), 3);
    // Pages of 5 at one resource version.
    let mut names = Vec::new();
    let mut cont = String::new();
    let mut pages = 0;
    loop {
        let url = if cont.is_empty() {
            format!("{base}/kube/registry/pods/?limit=5")
        } else {
            format!("{base}/kube/registry/pods/?limit=5&continue={cont}")
        };
        let page: Value = support::http::get(url).await.expect("page").json().await.expect("json");
        pages += 1;
        names.extend(
            page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|p| p["metadata"]["name"].as_str().expect("name").to_owned()),
        );
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_owned(),
            _ => break,
        }
    }
    assert_eq!((pages, names.len()), (3, 12));
    // A single object, and a missing one.
    let pod: Value = support::http::get(format!("{base}/kube/registry/pods/odd/p3"))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(pod["metadata"]["name"], "p3");
    let missing =
        support::http::get(format!("{base}/kube/registry/pods/odd/nope")).await.expect("get");
    assert_eq!(missing.status(), 404);
    let status: Value = missing.json().await.expect("json");
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str(), status["code"].as_u64()),
        (Some("Status"), Some("NotFound"), Some(404))
    );
    // Bad input: Kubernetes' 400s, and its 422 for invalid ListOptions (get.go's
    // ValidateListOptions).
    for (q, code, reason) in [
        ("labelSelector=app%3D%3D%3Dx", 400, "BadRequest"),
        ("resourceVersion=abc", 400, "BadRequest"),
        ("resourceVersionMatch=Exact", 422, "Invalid"),
        ("limit=-1", 400, "BadRequest"),
        ("watch=maybe", 400, "BadRequest"),
    ] {
        let r =
            support::http::get(format!("{base}/kube/registry/pods/?{q}")).await.expect("request");
        assert_eq!(r.status(), code, "{q}");
        let s: Value = r.json().await.expect("json");
        assert_eq!(s["reason"], reason, "{q}: {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_old_resource_version_gets_a_410_error_event() {
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.core.capacity = 20;
        cfg.cache.core.lower_bound_capacity = 20;
        cfg.cache.core.upper_bound_capacity = 20;
        cfg.cache.core.dynamic_capacity = false;
    })
    .await;
    let rev = pods(&env, 60).await;
    env.wait_cache_rev(rev).await;
    let resp = support::http::get(format!(
        "{}/kube/registry/pods/?watch=true&resourceVersion=5",
        env.http()
    ))
    .await
    .expect("watch");
    assert_eq!(resp.status(), 200);
    let got = lines(resp, Duration::from_secs(5), |l| !l.is_empty()).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["type"], "ERROR");
    assert_eq!(got[0]["object"]["code"], 410);
    assert_eq!(got[0]["object"]["reason"], "Expired");
    assert!(
        got[0]["object"]["message"]
            .as_str()
            .expect("message")
            .starts_with("too old resource version: 5"),
        "{}",
        got[0]
    );
    // Inside the window: the events after it.
    let resp = support::http::get(format!(
        "{}/kube/registry/pods/?watch=true&resourceVersion={}",
        env.http(),
        rev - 3
    ))
    .await
    .expect("watch");
    let got = lines(resp, Duration::from_secs(5), |l| l.len() >= 3).await;
    let rvs: Vec<_> = got
        .iter()
        .map(|e| e["object"]["metadata"]["resourceVersion"].as_str().expect("rv").to_owned())
        .collect();
    assert_eq!(rvs, vec![(rev - 2).to_string(), (rev - 1).to_string(), rev.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_initial_events_ends_with_the_annotated_bookmark() {
    let env = Env::start().await;
    let rev = pods(&env, 7).await;
    env.wait_cache_rev(rev).await;
    let url = format!(
        "{}/kube/registry/pods/?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=app%3Ddb",
        env.http()
    );
    let resp = support::http::get(url).await.expect("watch");
    assert_eq!(resp.status(), 200);
    let got =
        lines(resp, Duration::from_secs(5), |l| l.iter().any(|e| e["type"] == "BOOKMARK")).await;
    let (bookmark, added) = got.split_last().expect("events");
    assert_eq!(added.len(), 4, "{got:?}");
    assert!(added
        .iter()
        .all(|e| e["type"] == "ADDED" && e["object"]["metadata"]["labels"]["app"] == "db"));
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    let bookmark_rv: i64 = bookmark["object"]["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("number");
    assert!(bookmark_rv >= rev, "bookmark at {bookmark_rv}, written {rev}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_debug_state() {
    let env = Env::start().await;
    let base = env.http();
    assert_eq!(
        support::http::get(format!("{base}/healthz"))
            .await
            .expect("healthz")
            .text()
            .await
            .expect("text"),
        "ok"
    );
    let ready = support::http::get(format!("{base}/readyz")).await.expect("readyz");
    assert_eq!(ready.status(), 200);
    // Ready comes with the list; the upstream watch opens right after it (on a busy machine,
    // a moment later): the metrics are read again until it is counted, for at most 5 s.
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = support::http::get(format!("{base}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        if metrics.contains("watchcache_upstream_watches 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in [
        "apiserver_watch_cache_events_received_total{resource=\"/\",prefix=\"/\"}",
        "apiserver_watch_cache_initializations_total{resource=\"/\",prefix=\"/\"} 1",
        "watch_cache_capacity{resource=\"/\",prefix=\"/\"}",
        "apiserver_watch_cache_read_wait_seconds_bucket",
        "apiserver_cache_list_total",
        "watchcache_upstream_requests_total{kind=\"list\"} 1",
        "watchcache_upstream_watches 1",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    let state: Value = support::http::get(format!("{base}/debug/state"))
        .await
        .expect("state")
        .json()
        .await
        .expect("json");
    assert_eq!(state["caches"][0]["prefix"], "/");
    assert_eq!(state["caches"][0]["ready"], true);
    assert!(state["caches"][0]["window"]["capacity"].as_u64().is_some());
}

/// A client that goes away ends its watch at once, even when nothing is sent to it: the
/// server must not keep dead watchers (and their queues) until their next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_client_goes_away_without_events() {
    let env = Env::start().await;
    let rev = pods(&env, 4).await;
    env.wait_cache_rev(rev).await;
    let base = env.http();
    let metrics = format!("{base}/metrics");
    let watchers = || support::metric(&metrics, "watchcache_watchers", "");
    let client = support::http::Client::new();
    let mut open = Vec::new();
    for _ in 0..3 {
        let r = client
            .get(format!(
                "{base}/kube/registry/pods/?watch=true&resourceVersion={rev}&labelSelector=app%3Dnone"
            ))
            .await
            .expect("watch");
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    assert_eq!(watchers().await, 3.0);
    drop(open);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while watchers().await > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead watches still held 5 s after their clients left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
