//! A service registry: instances register under `/services/<service>/<id>` with a lease they
//! keep alive; the registry keeps the live set from the cache (one list, then a watch from its
//! revision). An instance that stops (its lease revoked or expired) leaves the set.
//!
//! `cargo run -p host-etcd --example service_registry` (starts its own etcd from .tools/bin or
//! PATH; set WATCHCACHE_ETCD_ENDPOINTS=host:port to use another).

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, EventType, PutOptions};
use futures::StreamExt;
use host_etcd::{Cache, EmbeddedEtcd, EtcdOptions, GetOptions, Keys, WatchOptions};

/// Registers an instance with a 5 s lease kept alive in the background; returns the lease.
async fn register(
    client: &mut Client,
    service: &str,
    id: &str,
    addr: &str,
) -> Result<i64, etcd_client::Error> {
    let lease = client.lease_grant(5, None).await?.id();
    client
        .put(format!("/services/{service}/{id}"), addr, Some(PutOptions::new().with_lease(lease)))
        .await?;
    let (mut keeper, mut acks) = client.lease_keep_alive(lease).await?;
    tokio::spawn(async move {
        loop {
            if keeper.keep_alive().await.is_err() || acks.message().await.ok().flatten().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    Ok(lease)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut _etcd = None;
    let endpoint = match std::env::var("WATCHCACHE_ETCD_ENDPOINTS") {
        Ok(e) => e,
        Err(_) => {
            let etcd = EmbeddedEtcd::start(EtcdOptions::default()).await?;
            let e = etcd.endpoint();
            _etcd = Some(etcd);
            e
        }
    };
    let mut client = Client::connect([endpoint.as_str()], None).await?;
    let _api1 = register(&mut client, "api", "api-1", "10.0.0.1:80").await?;
    let api2 = register(&mut client, "api", "api-2", "10.0.0.2:80").await?;
    let _db1 = register(&mut client, "db", "db-1", "10.0.1.1:5432").await?;

    let cache = Cache::new(client.clone(), "/services/").await?;
    cache.wait_ready(Duration::from_secs(10)).await?;
    let now = cache.get(Keys::prefix("/services/"), GetOptions::new()).await?;
    let mut live: BTreeMap<String, String> = now
        .kvs()
        .iter()
        .map(|kv| {
            (kv.key_str().unwrap_or("?").to_owned(), kv.value_str().unwrap_or("?").to_owned())
        })
        .collect();
    println!(
        "registry at revision {}: {:?}",
        now.header().map_or(0, |h| h.revision()),
        live.keys().collect::<Vec<_>>()
    );
    let mut watch = cache
        .watch(
            Keys::prefix("/services/api/"),
            WatchOptions::new().with_start_revision(now.header().map_or(0, |h| h.revision()) + 1),
        )
        .await?;

    // api-2 goes away (its lease revoked, as when it shuts down cleanly), api-3 comes up.
    let mut ops = client.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = ops.lease_revoke(api2).await;
        let _ = register(&mut ops, "api", "api-3", "10.0.0.3:80").await;
    });
    let mut changes = 0;
    while changes < 2 {
        let resp = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await?
            .ok_or("watch ended")??;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = kv.key_str()?.to_owned();
            let id = key.rsplit('/').next().unwrap_or("?").to_owned();
            match ev.event_type() {
                EventType::Put => {
                    println!("{id} joined at {}", kv.value_str()?);
                    live.insert(key, kv.value_str()?.to_owned());
                }
                EventType::Delete => {
                    println!("{id} left");
                    live.remove(&key);
                }
            }
            changes += 1;
        }
    }
    let api: Vec<_> = live
        .iter()
        .filter(|(k, _)| k.starts_with("/services/api/"))
        .map(|(_, v)| v.as_str())
        .collect();
    println!("api endpoints now: {api:?}");
    cache.close().await;
    Ok(())
}
