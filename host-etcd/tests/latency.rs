//! Round trips through watchcache against etcd's own, on loopback: a small response must not
//! wait for the client's delayed ACK (Nagle's algorithm on an accepted socket cost about 40 ms a
//! round trip), for a watch's `created`, a cached read, or a call passed through. The bounds
//! are loose (the machine is shared during `make test`); `make bench-host` has the figures.

use crate::support;

use std::time::{Duration, Instant};

use etcd_client::{Client, Txn, TxnOp};
use support::Env;

async fn p50(mut f: impl AsyncFnMut() -> ()) -> Duration {
    let mut v = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    v.sort();
    v[v.len() / 2]
}

async fn round_trips(c: &mut Client) -> [(&'static str, Duration); 4] {
    let put = p50(async || {
        c.put("/lat/k", "v", None).await.expect("put");
    })
    .await;
    let txn = p50(async || {
        c.txn(Txn::new().and_then([TxnOp::put("/lat/t", "v", None)])).await.expect("txn");
    })
    .await;
    let get = p50(async || {
        c.get("/lat/k", Some(etcd_client::GetOptions::new().with_serializable()))
            .await
            .expect("get");
    })
    .await;
    let created = p50(async || {
        let mut s = c.watch("/lat/", None).await.expect("watch");
        s.message().await.expect("ok").expect("created");
    })
    .await;
    [("put", put), ("txn", txn), ("get", get), ("watch created", created)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_are_close_to_etcds() {
    let env = Env::start().await;
    let mut direct = env.direct().await;
    let mut cached = env.cached().await;
    // Warm both paths.
    round_trips(&mut direct).await;
    round_trips(&mut cached).await;
    let d = round_trips(&mut direct).await;
    let w = round_trips(&mut cached).await;
    for ((name, de), (_, we)) in d.iter().zip(w.iter()) {
        eprintln!("{name}: etcd {de:?}, through watchcache {we:?}");
        assert!(
            *we < *de * 3 + Duration::from_millis(5),
            "{name}: {we:?} through watchcache against etcd's {de:?}"
        );
    }
}
