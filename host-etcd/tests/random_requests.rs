//! Seeded random requests, each sent alike to etcd and to watchcache, whose answers must be
//! equal. `Range` and `RangeStream`: the same protobuf to both, answers equal field by field (kvs with every revision, version and lease,
//! count, more, the header's revision, or the same error). The history behind them has
//! overwrites, deletes of single keys and of ranges, transactions, leases revoked (deletes
//! with no delete request), keys deleted and created again, binary keys, and a compaction; the
//! requests mix every `RangeRequest` field: single keys, prefixes, ranges (empty and inverted),
//! from-key, revisions now, past, compacted and future, limits, keys-only, count-only,
//! serializable, every sort order and target, and the revision filters. `Watch`: random ranges
//! starting now, at the compaction and at the window's edges, in the future and anywhere in
//! the history, with prev_kv and filters, while more writes come; the same events, the same
//! cancellations (with the compaction revision), no revision split across responses.
//!
//! `WATCHCACHE_TEST_SEED=<n>` replays one seed (`<a>-<b>`: a sweep); a failure prints the seed
//! and the request.

use crate::support;

use etcd_client::proto::{PbRangeRequest, PbRangeResponse, PbRangeStreamResponse};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use host_etcd::EtcdOptions;
use support::conformance::{check, collect, history_from, resp_of, Recorded};
use support::Env;

/// The seeds: `WATCHCACHE_TEST_SEED` (`7`, or `3-40` for a sweep), else 1 and 2.
fn seeds() -> Vec<u64> {
    let Ok(v) = std::env::var("WATCHCACHE_TEST_SEED") else { return vec![1, 2] };
    let n = |x: &str| -> u64 { x.trim().parse().expect("WATCHCACHE_TEST_SEED: N or A-B") };
    match v.split_once('-') {
        Some((a, b)) => (n(a)..=n(b)).collect(),
        None => vec![n(&v)],
    }
}

/// splitmix64: a seeded generator, so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// The keys the history writes, chosen to sit on each other's prefix and range boundaries.
fn keys() -> Vec<Vec<u8>> {
    let mut ks: Vec<Vec<u8>> =
        ["/q/a", "/q/a/", "/q/a/b", "/q/a/c", "/q/a0", "/q/b", "/q/ba", "/q/c"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
    ks.extend((0..30).map(|i| format!("/q/k/{i:02}").into_bytes()));
    ks.push(b"/q/\x00".to_vec());
    ks.push(b"/q/\xff".to_vec());
    ks.push(b"/q/\xff\xff".to_vec());
    ks.push(b"/q".to_vec());
    ks
}

/// One random write: put, delete, delete of a range, a transaction, a put with the lease.
async fn write(c: &mut Client, rng: &mut Rng, ks: &[Vec<u8>], lease: i64, i: usize) -> i64 {
    let k = rng.pick(ks).clone();
    let r = match rng.below(10) {
        0..=5 => c.put(k, format!("v{i}"), None).await.expect("put").header().map(|h| h.revision()),
        6 => c.delete(k, None).await.expect("delete").header().map(|h| h.revision()),
        7 if rng.chance(50) => {
            let end = rng.pick(ks).clone();
            let opts = etcd_client::DeleteOptions::new().with_range(end);
            c.delete(k, Some(opts)).await.expect("delete range").header().map(|h| h.revision())
        }
        8 => {
            // Another key (etcd refuses a transaction that writes one key twice).
            let mut k2 = rng.pick(ks).clone();
            if k2 == k {
                k2 = ks.iter().find(|x| **x != k).cloned().unwrap_or_default();
            }
            let txn = Txn::new()
                .when(vec![Compare::version(k.clone(), CompareOp::Greater, 0)])
                .and_then(vec![
                    TxnOp::put(k.clone(), format!("t{i}"), None),
                    TxnOp::delete(k2.clone(), None),
                ])
                .or_else(vec![TxnOp::put(k2, format!("e{i}"), None)]);
            c.txn(txn).await.expect("txn").header().map(|h| h.revision())
        }
        _ => c
            .put(k, format!("l{i}"), Some(PutOptions::new().with_lease(lease)))
            .await
            .expect("put with lease")
            .header()
            .map(|h| h.revision()),
    };
    r.expect("header")
}

/// A random `RangeRequest` over the keys, at a revision up to `now + 3`, often one next to the
/// compaction or to the current revision (the boundaries).
fn request(rng: &mut Rng, ks: &[Vec<u8>], now: i64, compacted: i64) -> PbRangeRequest {
    let mut r = PbRangeRequest { key: rng.pick(ks).clone(), ..Default::default() };
    match rng.below(8) {
        0 => {}
        1 => r.key.truncate(rng.below(r.key.len() as u64 + 1) as usize),
        2..=5 => {
            // A prefix, of a whole key or of its first bytes (as "/q/" or "/q/k/"): the key
            // with its last byte below 0xff incremented (etcd's GetPrefixRangeEnd).
            if rng.chance(50) {
                r.key.truncate(3 + rng.below(r.key.len() as u64 - 2) as usize);
            }
            let mut end = r.key.clone();
            while let Some(last) = end.pop() {
                if last < 0xff {
                    end.push(last + 1);
                    break;
                }
            }
            if end.is_empty() {
                end = vec![0];
            }
            r.range_end = end;
        }
        6 => r.range_end = rng.pick(ks).clone(),
        _ => r.range_end = vec![0],
    }
    if rng.chance(20) {
        r.revision = 1 + rng.below(now as u64 + 3) as i64;
    } else if rng.chance(20) {
        r.revision = *rng.pick(&[compacted - 1, compacted, compacted + 1, now, now + 1]);
    }
    if rng.chance(40) {
        let most = if rng.chance(50) { 3 } else { 12 };
        r.limit = rng.below(most) as i64;
    }
    r.keys_only = rng.chance(20);
    r.count_only = rng.chance(15);
    r.serializable = rng.chance(30);
    if rng.chance(25) {
        r.sort_order = rng.below(3) as i32;
        r.sort_target = rng.below(5) as i32;
    }
    if rng.chance(10) {
        let rev = 1 + rng.below(now as u64) as i64;
        match rng.below(4) {
            0 => r.min_mod_revision = rev,
            1 => r.max_mod_revision = rev,
            2 => r.min_create_revision = rev,
            _ => r.max_create_revision = rev,
        }
    }
    r
}

async fn channel(ep: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{ep}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

async fn range(
    ch: &tonic::transport::Channel,
    r: PbRangeRequest,
) -> Result<PbRangeResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<PbRangeRequest, PbRangeResponse>::default();
    let path = http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Range");
    grpc.unary(tonic::Request::new(r), path, codec).await.map(|r| r.into_inner())
}

/// etcd 3.7's `RangeStream`: every message of the stream, or the error.
async fn range_stream(ch: &tonic::transport::Channel, r: PbRangeRequest) -> String {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<PbRangeRequest, PbRangeStreamResponse>::default();
    let path = http::uri::PathAndQuery::from_static("/etcdserverpb.KV/RangeStream");
    let mut out = Vec::new();
    match grpc.server_streaming(tonic::Request::new(r), path, codec).await {
        Ok(s) => {
            let mut s = s.into_inner();
            loop {
                match s.message().await {
                    Ok(Some(m)) => out.push(answer(Ok(m.range_response.unwrap_or_default()))),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(answer(Err(e)));
                        break;
                    }
                }
            }
        }
        Err(e) => out.push(answer(Err(e))),
    }
    out.join("\n    then ")
}

/// What must be equal: every kv's fields, count, more and the header's revision, or the error.
fn answer(r: Result<PbRangeResponse, tonic::Status>) -> String {
    match r {
        Ok(r) => {
            let kvs: Vec<_> = r
                .kvs
                .iter()
                .map(|k| {
                    (
                        String::from_utf8_lossy(&k.key).into_owned(),
                        String::from_utf8_lossy(&k.value).into_owned(),
                        k.create_revision,
                        k.mod_revision,
                        k.version,
                        k.lease,
                    )
                })
                .collect();
            let rev = r.header.map(|h| h.revision);
            format!("kvs {kvs:?} count {} more {} header revision {rev:?}", r.count, r.more)
        }
        Err(s) => format!("error {:?}: {}", s.code(), s.message()),
    }
}

/// How many requests of each kind etcd answered, so that the test can tell it tried them.
#[derive(Debug, Default)]
struct Coverage {
    more: usize,
    count_only_limited: usize,
    keys_only: usize,
    past_revision: usize,
    compacted: usize,
    future: usize,
    sorted: usize,
    filtered: usize,
    empty: usize,
    streams_of_chunks: usize,
}

impl Coverage {
    fn note(&mut self, r: &PbRangeRequest, d: &Result<PbRangeResponse, tonic::Status>) {
        let Ok(d) = d else {
            if let Err(s) = d {
                self.compacted += s.message().contains("compacted") as usize;
                self.future += s.message().contains("future") as usize;
            }
            return;
        };
        let plain = r.sort_order == 0
            && r.sort_target == 0
            && r.min_mod_revision + r.max_mod_revision == 0
            && r.min_create_revision + r.max_create_revision == 0;
        self.more += (plain && d.more) as usize;
        self.count_only_limited +=
            (plain && r.count_only && r.limit > 0 && d.count > r.limit) as usize;
        self.keys_only += (r.keys_only && !r.count_only && !d.kvs.is_empty()) as usize;
        self.past_revision += (r.revision > 0) as usize;
        self.sorted += (r.sort_order != 0 || r.sort_target != 0) as usize;
        self.filtered += (r.min_mod_revision
            + r.max_mod_revision
            + r.min_create_revision
            + r.max_create_revision
            > 0) as usize;
        self.empty += d.kvs.is_empty() as usize;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ranges_match_etcd() {
    support::init_tracing();
    let seeds = seeds();
    let replay = seeds.len() == 1;
    let env = Env::start().await;
    let (etcd_ch, cache_ch) = (channel(&env.etcd.endpoint()).await, channel(&env.grpc()).await);
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let ks = keys();
    let mut compared = 0;
    let mut cover = Coverage::default();
    let mut differ = Vec::new();
    let before = env.cache_metric("watchcache_range_requests_total", "source=\"cache\"").await;
    for seed in seeds {
        let mut rng = Rng(seed);
        // Clear the keys (a delete is a revision too), then a history in three parts with a
        // compaction after the first and a lease revoked in the second.
        direct.delete("/q", Some(etcd_client::DeleteOptions::new().with_from_key())).await.ok();
        let mut lease = direct.lease_grant(600, None).await.expect("lease").id();
        for k in &ks {
            direct.put(k.clone(), "first", None).await.expect("put");
        }
        let mut now = 0;
        let mut compacted = 1;
        for part in 0..3 {
            for i in 0..80 {
                now = write(&mut direct, &mut rng, &ks, lease, part * 100 + i).await;
            }
            match part {
                0 => {
                    compacted = now - 1 - rng.below(30) as i64;
                    // Through watchcache, as kube-apiserver compacts: the cache is told.
                    cached.compact(compacted, None).await.expect("compact");
                }
                1 => {
                    direct.lease_revoke(lease).await.expect("revoke");
                    lease = direct.lease_grant(600, None).await.expect("lease").id();
                    now = env.etcd_rev().await;
                }
                _ => {}
            }
            env.wait_cache_rev(now).await;
            for _ in 0..150 {
                let r = request(&mut rng, &ks, now, compacted);
                let d = range(&etcd_ch, r.clone()).await;
                cover.note(&r, &d);
                let d = answer(d);
                let w = answer(range(&cache_ch, r.clone()).await);
                compared += 1;
                if d != w {
                    differ
                        .push(format!("seed {seed}: {r:?}\n  etcd:       {d}\n  watchcache: {w}"));
                }
                // The same request as a stream, chunk by chunk.
                let d = range_stream(&etcd_ch, r.clone()).await;
                let w = range_stream(&cache_ch, r.clone()).await;
                cover.streams_of_chunks += d.contains("then") as usize;
                if d != w {
                    differ.push(format!(
                        "seed {seed}: RangeStream {r:?}\n  etcd:       {d}\n  watchcache: {w}"
                    ));
                }
            }
        }
    }
    let served =
        env.cache_metric("watchcache_range_requests_total", "source=\"cache\"").await - before;
    assert!(
        differ.is_empty(),
        "{} of {compared} ranges differ from etcd's:\n{}",
        differ.len(),
        differ.join("\n")
    );
    eprintln!("{cover:?}");
    // The requests reached each kind of answer (a change to the generator cannot quietly lose
    // one): more pages, count-only beyond its limit, keys-only, past, compacted and future
    // revisions, sorts, filters: asserted for the default seeds (a single seed replayed may
    // miss one kind).
    let c = &cover;
    for (what, n, least) in [
        ("more", c.more, 15),
        ("count only beyond the limit", c.count_only_limited, 3),
        ("keys only", c.keys_only, 20),
        ("past revision", c.past_revision, 50),
        ("compacted", c.compacted, 30),
        ("future", c.future, 10),
        ("sorted", c.sorted, 50),
        ("filtered", c.filtered, 20),
        ("RangeStream in several chunks", c.streams_of_chunks, 20),
    ] {
        assert!(replay || n >= least, "only {n} requests of the kind {what:?} (at least {least})");
    }
    // Most of them came from the cache (the rest: sorted, filtered, compacted, out of the prefix).
    assert!(served >= compared as f64 / 3.0, "{served} of {compared} served from the cache");
    drop(cached);
}

/// A random watch: a range as `request` makes them, a start revision next to one of the
/// history's edges or anywhere in it, prev_kv and a filter sometimes.
struct WatchCase {
    key: Vec<u8>,
    end: Vec<u8>,
    start: i64,
    prev_kv: bool,
    filter: Option<WatchFilterType>,
}

impl WatchCase {
    fn options(&self) -> WatchOptions {
        let mut o = WatchOptions::new().with_start_revision(self.start);
        if !self.end.is_empty() {
            o = o.with_range(self.end.clone());
        }
        if self.prev_kv {
            o = o.with_prev_key();
        }
        if let Some(f) = self.filter {
            o = o.with_filters([f]);
        }
        o
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_watches_match_etcd() {
    support::init_tracing();
    let seeds = seeds();
    let replay = seeds.len() == 1;
    // A small window, so that its edge is inside the history.
    let env = Env::start_with(EtcdOptions::default(), |cfg| {
        cfg.cache.core.capacity = 40;
        cfg.cache.core.lower_bound_capacity = 40;
        cfg.cache.core.upper_bound_capacity = 40;
        cfg.cache.core.dynamic_capacity = false;
    })
    .await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    let ks = keys();
    let mut violations = Vec::new();
    let mut watched = 0;
    let mut canceled = 0;
    let mut events = 0;
    let mut compacted = 1;
    for seed in seeds {
        let mut rng = Rng(seed);
        let mut lease = direct.lease_grant(600, None).await.expect("lease").id();
        let mut now = 0;
        for i in 0..100 {
            now = write(&mut direct, &mut rng, &ks, lease, i).await;
        }
        compacted = compacted.max(now - 30 - rng.below(20) as i64);
        cached.compact(compacted, None).await.expect("compact");
        env.wait_cache_rev(now).await;
        let oldest = env.server().caches()[0].status().oldest_servable.expect("window") as i64;
        let mut cases = Vec::new();
        for _ in 0..40 {
            let r = request(&mut rng, &ks, now, compacted);
            let anywhere = 1 + rng.below(now as u64) as i64;
            let start = *rng.pick(&[
                0,
                compacted - 1,
                compacted,
                compacted + 1,
                oldest - 1,
                oldest,
                oldest + 1,
                now,
                now + 1,
                now + 5,
                anywhere,
            ]);
            let filter = match rng.below(5) {
                0 => Some(WatchFilterType::NoPut),
                1 => Some(WatchFilterType::NoDelete),
                _ => None,
            };
            cases.push(WatchCase {
                key: r.key,
                end: r.range_end,
                start,
                prev_kv: rng.chance(50),
                filter,
            });
        }
        let mut streams = Vec::new();
        for (n, c) in cases.iter().enumerate() {
            let mut pair = Vec::new();
            for (side, client) in [("etcd", &mut direct), ("watchcache", &mut cached)] {
                let name = format!(
                    "seed {seed} watch {n} on {side}: {:?}..{:?} from {} prev_kv={} filter={:?}",
                    String::from_utf8_lossy(&c.key),
                    String::from_utf8_lossy(&c.end),
                    c.start,
                    c.prev_kv,
                    c.filter
                );
                let mut rec = Recorded {
                    name,
                    key: c.key.clone(),
                    range_end: c.end.clone(),
                    start_rev: c.start,
                    no_delete: c.filter == Some(WatchFilterType::NoDelete),
                    no_put: c.filter == Some(WatchFilterType::NoPut),
                    ..Default::default()
                };
                let mut s = client.watch(c.key.clone(), Some(c.options())).await.expect("watch");
                // Created before the writes below, so that a watch from now sees them all.
                let m = s.message().await.expect("created").expect("created");
                rec.created_rev = m.header().map_or(0, |h| h.revision());
                rec.responses.push(resp_of(&m));
                pair.push((s, rec));
            }
            streams.push(pair);
        }
        for i in 0..60 {
            write(&mut direct, &mut rng, &ks, lease, 100 + i).await;
        }
        direct.lease_revoke(lease).await.expect("revoke");
        lease = direct.lease_grant(600, None).await.expect("lease").id();
        let _ = lease;
        let until = env.etcd_rev().await;
        let hist = history_from(&mut direct, compacted, until).await;
        for (c, pair) in cases.iter().zip(streams.iter_mut()) {
            let mut recs = Vec::new();
            for (s, rec) in pair.iter_mut() {
                s.request_progress().await.expect("progress request");
                collect(s, rec, until, Duration::from_secs(15)).await;
                if rec.last_rev() < until && rec.canceled().is_none() {
                    violations.push(format!("{}: stuck at {} < {until}", rec.name, rec.last_rev()));
                }
                recs.push(rec.clone());
            }
            let (d, w) = (&recs[0], &recs[1]);
            watched += 1;
            events += d.events().count();
            let cancel =
                |r: &Recorded| r.canceled().map(|x| (x.compact_rev, x.cancel_reason.clone()));
            canceled += cancel(d).is_some() as usize;
            if cancel(d) != cancel(w) {
                violations.push(format!(
                    "{}: canceled {:?}, etcd {:?}",
                    w.name,
                    cancel(w),
                    cancel(d)
                ));
            }
            let (de, we): (Vec<_>, Vec<_>) =
                (d.events().cloned().collect(), w.events().cloned().collect());
            if de != we {
                let first = de.iter().zip(&we).position(|(a, b)| a != b);
                let at = first.unwrap_or(de.len().min(we.len()));
                violations.push(format!(
                    "{}: {} events, etcd {}; first difference at {at}: {:?}, etcd {:?}",
                    w.name,
                    we.len(),
                    de.len(),
                    we.get(at),
                    de.get(at)
                ));
            }
            if c.start == 0 && d.created_rev != w.created_rev {
                violations.push(format!(
                    "{}: created at {}, etcd at {}",
                    w.name, w.created_rev, d.created_rev
                ));
            }
            // Ordered, unique, in range, every event of etcd's history, no revision split (the
            // previous values are compared with etcd's above).
            if cancel(w).is_none() {
                violations.extend(check(&hist, w));
            }
        }
    }
    assert!(violations.is_empty(), "{} violations:\n{}", violations.len(), violations.join("\n"));
    eprintln!("{watched} watches, {canceled} canceled as compacted, {events} events");
    assert!(replay || canceled >= 3, "only {canceled} watches started below the compaction");
    assert!(replay || events >= 500, "only {events} events");
}
