//! Round trips through watchcache against etcd's own, on loopback: a small response must not
//! wait for the client's delayed ACK (Nagle's algorithm on an accepted socket cost about 40 ms a
//! round trip), for a watch's `created`, a cached read, or a call passed through. The bounds
//! are loose (the machine is shared during `make test`); `make bench-host` has the figures.

use crate::support;

use std::time::{Duration, Instant};

use etcd_client::{Client, Txn, TxnOp};
use support::Env;

/// The median of 40 round trips on each path, the two taking turns call by call, so that
/// whatever else runs on the machine (`make test` runs tests side by side) weighs on both alike.
async fn p50s(
    direct: &mut Client,
    cached: &mut Client,
    mut f: impl AsyncFnMut(&mut Client) -> (),
) -> (Duration, Duration) {
    let (mut d, mut w) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        for (c, v) in [(&mut *direct, &mut d), (&mut *cached, &mut w)] {
            let t = Instant::now();
            f(c).await;
            v.push(t.elapsed());
        }
    }
    d.sort();
    w.sort();
    (d[d.len() / 2], w[w.len() / 2])
}

async fn round_trips(d: &mut Client, w: &mut Client) -> [(&'static str, (Duration, Duration)); 4] {
    let put = p50s(d, w, async |c| {
        c.put("/lat/k", "v", None).await.expect("put");
    })
    .await;
    let txn = p50s(d, w, async |c| {
        c.txn(Txn::new().and_then([TxnOp::put("/lat/t", "v", None)])).await.expect("txn");
    })
    .await;
    let get = p50s(d, w, async |c| {
        c.get("/lat/k", Some(etcd_client::GetOptions::new().with_serializable()))
            .await
            .expect("get");
    })
    .await;
    let created = p50s(d, w, async |c| {
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
    round_trips(&mut direct, &mut cached).await;
    for (name, (de, we)) in round_trips(&mut direct, &mut cached).await {
        eprintln!("{name}: etcd {de:?}, through watchcache {we:?}");
        assert!(
            we < de * 3 + Duration::from_millis(5),
            "{name}: {we:?} through watchcache against etcd's {de:?}"
        );
    }
}
