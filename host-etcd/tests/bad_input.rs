//! Bad input gets etcd's own error codes and messages through watchcache, and nothing crashes
//! it: malformed protobuf, bad ranges, negative and absurd revisions, oversized values, unknown
//! methods, garbage on watch streams. Each request goes to etcd and to watchcache; the answers
//! are compared.

use crate::support;

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use etcd_client::proto::{PbRangeRequest, PbWatchRequest, PbWatchRequestUnion};
use etcd_client::{GetOptions, WatchOptions};
use support::Env;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Sends and receives raw bytes (to send what no well-behaved client would).
#[derive(Clone, Copy, Default)]
struct Raw;
struct RawEnc;
struct RawDec;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEnc;
    type Decoder = RawDec;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> RawDec {
        RawDec
    }
}

impl Encoder for RawEnc {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

async fn raw_unary(endpoint: &str, path: &'static str, body: Bytes) -> Result<Bytes, Status> {
    let mut g = support::grpc(endpoint).await;
    g.unary(tonic::Request::new(body), http::uri::PathAndQuery::from_static(path), Raw)
        .await
        .map(|r| r.into_inner())
}

async fn raw_watch(endpoint: &str, msgs: Vec<Bytes>) -> (Vec<Bytes>, Option<Status>) {
    let mut g = support::grpc(endpoint).await;
    let stream = tokio_stream::iter(msgs);
    let resp = g
        .streaming(
            tonic::Request::new(stream),
            http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch"),
            Raw,
        )
        .await;
    let mut s = match resp {
        Ok(s) => s.into_inner(),
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(500), s.message()).await {
            Ok(Ok(Some(m))) => got.push(m),
            Ok(Ok(None)) | Err(_) => return (got, None),
            Ok(Err(e)) => return (got, Some(e)),
        }
    }
}

/// An etcd-client result with errors as (code, message), without transport headers.
fn norm<T: std::fmt::Debug>(r: Result<T, etcd_client::Error>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(etcd_client::Error::GRpcStatus(s)) => format!("Err({:?}, {:?})", s.code(), s.message()),
        Err(e) => format!("Err({e})"),
    }
}

fn enc<M: prost::Message>(m: &M) -> Bytes {
    Bytes::from(m.encode_to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_etcds_errors_and_nothing_crashes() {
    let env = Env::start().await;
    let (direct_ep, cache_ep) = (env.etcd.endpoint(), env.grpc());
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    direct.put("/a/1", "x", None).await.expect("put");
    env.wait_cache_rev(env.etcd_rev().await).await;

    // Ranges through the typed client.
    let cases: Vec<(&str, &str, Option<GetOptions>)> = vec![
        ("empty key", "", None),
        ("negative revision", "/a/", Some(GetOptions::new().with_prefix().with_revision(-5))),
        ("absurd revision", "/a/", Some(GetOptions::new().with_prefix().with_revision(i64::MAX))),
        ("negative limit", "/a/", Some(GetOptions::new().with_prefix().with_limit(-3))),
        ("end before key", "/b", Some(GetOptions::new().with_range("/a"))),
        ("binary key", "\u{0}\u{1}\u{ff}", None),
    ];
    for (name, key, opts) in cases {
        let d = direct.get(key, opts.clone()).await.map(|r| (r.kvs().len(), r.count(), r.more()));
        let w = cached.get(key, opts).await.map(|r| (r.kvs().len(), r.count(), r.more()));
        assert_eq!(norm(d), norm(w), "{name}");
    }

    // Malformed protobuf and unknown methods, as raw bytes.
    let garbage = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a]);
    for path in [
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.KV/Put",
        "/etcdserverpb.KV/Txn",
        "/etcdserverpb.Lease/LeaseGrant",
    ] {
        let d = raw_unary(&direct_ep, path, garbage.clone()).await.expect_err("garbage refused");
        let w = raw_unary(&cache_ep, path, garbage.clone()).await.expect_err("garbage refused");
        assert_eq!(d.code(), w.code(), "{path}: {d:?} vs {w:?}");
        // Whatever the cache cannot read goes to etcd as it came: etcd's own words.
        assert_eq!(d.message(), w.message(), "{path}");
    }
    let d = raw_unary(&direct_ep, "/etcdserverpb.KV/NoSuchMethod", Bytes::new())
        .await
        .expect_err("unknown");
    let w = raw_unary(&cache_ep, "/etcdserverpb.KV/NoSuchMethod", Bytes::new())
        .await
        .expect_err("unknown");
    assert_eq!(d.code(), w.code());
    let d = raw_unary(&direct_ep, "/no.Such/Service", Bytes::new()).await.expect_err("unknown");
    let w = raw_unary(&cache_ep, "/no.Such/Service", Bytes::new()).await.expect_err("unknown");
    assert_eq!(d.code(), w.code());
    // A valid Range in raw bytes works through both.
    let ok = enc(&PbRangeRequest { key: b"/a/1".to_vec(), ..Default::default() });
    assert!(raw_unary(&direct_ep, "/etcdserverpb.KV/Range", ok.clone()).await.is_ok());
    assert!(raw_unary(&cache_ep, "/etcdserverpb.KV/Range", ok).await.is_ok());

    // An oversized value.
    let big = vec![b'x'; 2 << 20];
    let d = direct.put("/a/big", big.clone(), None).await.expect_err("too large");
    let w = cached.put("/a/big", big, None).await.expect_err("too large");
    assert_eq!(norm::<()>(Err(d)), norm::<()>(Err(w)));
    // Oversized range requests: a 3 MiB key (above etcd's limit, under what watchcache reads)
    // and a 5 MiB one (above both): etcd's own refusal, word for word.
    for mib in [3, 5] {
        let huge_key = vec![b'k'; mib << 20];
        let d = direct.get(huge_key.clone(), None).await.expect_err("too large");
        let w = cached.get(huge_key, None).await.expect_err("too large");
        assert_eq!(norm::<()>(Err(d)), norm::<()>(Err(w)), "a {mib} MiB key");
    }

    // Watch requests: bad ranges and revisions get etcd's answers.
    let watch_cases: Vec<(&str, &str, WatchOptions)> = vec![
        ("end before key", "/b", WatchOptions::new().with_range("/a")),
        ("negative start", "/a/", WatchOptions::new().with_prefix().with_start_revision(-7)),
        ("absurd start", "/a/", WatchOptions::new().with_prefix().with_start_revision(i64::MAX)),
        ("empty key", "", WatchOptions::new()),
    ];
    for (name, key, opts) in watch_cases {
        let mut answers = Vec::new();
        for c in [&mut direct, &mut cached] {
            let mut s = c.watch(key, Some(opts.clone())).await.expect("stream");
            let m = tokio::time::timeout(Duration::from_secs(5), s.message())
                .await
                .expect("answer")
                .expect("ok")
                .expect("msg");
            answers.push((
                m.watch_id(),
                m.created(),
                m.canceled(),
                m.cancel_reason().to_owned(),
                m.events().len(),
            ));
        }
        assert_eq!(answers[0], answers[1], "watch {name}");
    }
    // An oversized Compact (read here, not passed through): etcd's refusal, word for word.
    let mut compact = Vec::new();
    prost::encoding::bytes::encode(15, &vec![0u8; 5 << 20], &mut compact);
    let path = "/etcdserverpb.KV/Compact";
    let d = raw_unary(&direct_ep, path, Bytes::from(compact.clone())).await.expect_err("large");
    let w = raw_unary(&cache_ep, path, Bytes::from(compact)).await.expect_err("large");
    assert_eq!((d.code(), d.message()), (w.code(), w.message()), "a 5 MiB Compact");
    // Oversized watch requests: etcd ends the stream with its refusal, word for word.
    for mib in [3, 5] {
        // WatchRequest{create_request (1): WatchCreateRequest{key (1)}}, by hand (etcd-client
        // does not export WatchCreateRequest).
        let mut inner = Vec::new();
        prost::encoding::bytes::encode(1, &vec![b'k'; mib << 20], &mut inner);
        let mut create = Vec::new();
        prost::encoding::bytes::encode(1, &inner, &mut create);
        let create = Bytes::from(create);
        let (dm, de) = raw_watch(&direct_ep, vec![create.clone()]).await;
        let (wm, we) = raw_watch(&cache_ep, vec![create]).await;
        let status = |e: Option<Status>| e.map(|s| (s.code(), s.message().to_owned()));
        assert_eq!((dm.len(), status(de)), (wm.len(), status(we)), "a {mib} MiB watch key");
    }
    // Garbage and empty requests on a watch stream.
    let valid = enc(&PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    });
    let progress = enc(&PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
    });
    // (Whether etcd sends `created` before failing a stream whose second message is garbage
    // is a race inside etcd, so only the error is compared there.)
    for (msgs, same_count) in [
        (vec![garbage.clone()], true),
        (vec![Bytes::new(), valid.clone()], true),
        // A progress request before any watch: etcd has no watcher to answer for.
        (vec![progress.clone(), valid.clone()], true),
        (vec![valid.clone(), garbage.clone()], false),
    ] {
        let (dm, de) = raw_watch(&direct_ep, msgs.clone()).await;
        let (wm, we) = raw_watch(&cache_ep, msgs).await;
        if same_count {
            assert_eq!(dm.len(), wm.len(), "responses before the error");
        }
        assert_eq!(de.map(|s| s.code()), we.map(|s| s.code()));
    }

    // Still serving.
    let r = cached.get("/a/1", None).await.expect("still serving");
    assert_eq!(r.kvs()[0].value(), b"x");
    let text = support::http::get(format!("{}/healthz", env.http()))
        .await
        .expect("health")
        .text()
        .await
        .expect("text");
    assert_eq!(text, "ok");
}

/// etcd's gRPC server (grpc-go) takes request headers up to 16 MiB: a client with large
/// metadata (a long JWT, tracing baggage) is served through watchcache too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_metadata_is_taken_as_etcd_takes_it() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    direct.put("/a/1", "x", None).await.expect("put");
    env.wait_cache_rev(env.etcd_rev().await).await;
    for (kib, sort) in [(8, false), (64, false), (1024, false), (1024, true)] {
        // Sorted: passed through to etcd.
        let sort_order = if sort { 1 } else { 0 };
        let range = || PbRangeRequest { key: b"/a/1".to_vec(), sort_order, ..Default::default() };
        let large = || Some(("x-large", "v".repeat(kib << 10)));
        let d = support::range_with_metadata(&env.etcd.endpoint(), range(), large()).await;
        let w = support::range_with_metadata(&env.grpc(), range(), large()).await;
        assert_eq!(d, Ok(1), "{kib} KiB of metadata to etcd");
        assert_eq!(w, d, "{kib} KiB of metadata (sorted: {sort}): watchcache against etcd");
    }
}

/// A bad value on `watchcache serve`'s command line ends it at once (before any etcd is asked
/// or started) with the flag's name in the message, and no panic.
#[test]
fn bad_serve_flags_are_refused_by_name() {
    let bin = env!("CARGO_BIN_EXE_watchcache");
    for (args, flag) in [
        (&["--worker-threads", "0"][..], "--worker-threads"),
        (&["--worker-threads", "many"][..], "--worker-threads"),
        (&["--profile", "v9.9"][..], "--profile"),
        (&["--freshness", "sometimes"][..], "freshness"),
    ] {
        let out = std::process::Command::new(bin)
            .arg("serve")
            .args(["--etcd-endpoints", "127.0.0.1:1", "--etcd-start-timeout", "1s"])
            .args(args)
            .env_remove("WATCHCACHE_WORKER_THREADS")
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
