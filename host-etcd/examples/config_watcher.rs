//! A config watcher: reads a configuration prefix from the cache once, then follows every change
//! from the revision it read at (etcd's "get, then watch from rev + 1" pattern), with the
//! previous values.
//!
//! `cargo run -p host-etcd --example config_watcher` (starts its own etcd from .tools/bin or
//! PATH; set WATCHCACHE_ETCD_ENDPOINTS=host:port to use another).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use host_etcd::{Cache, EmbeddedEtcd, EtcdOptions, GetOptions, Keys, WatchOptions};

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
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await?;
    client.put("/config/replicas", "3", None).await?;
    client.put("/config/feature-x", "on", None).await?;

    let cache = Cache::new(client.clone(), "/config/").await?;
    cache.wait_ready(Duration::from_secs(10)).await?;

    // The configuration now (a consistent read, from memory).
    let now = cache.get(Keys::prefix("/config/"), GetOptions::new()).await?;
    let mut config: BTreeMap<String, String> = now
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap_or("?").trim_start_matches("/config/").to_owned(),
                kv.value_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let rev = now.header().map_or(0, |h| h.revision());
    println!("config at revision {rev}: {config:?}");

    // Someone changes it.
    let mut operator = client.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = operator.put("/config/replicas", "5", None).await;
        let _ = operator.delete("/config/feature-x", None).await;
    });

    // Every change after `rev`, in order, none missed.
    let mut changes = cache
        .watch(
            Keys::prefix("/config/"),
            WatchOptions::new().with_start_revision(rev + 1).with_prev_kv(),
        )
        .await?;
    let mut seen = 0;
    while seen < 2 {
        let resp = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await?
            .ok_or("watch ended")??;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let name = kv.key_str()?.trim_start_matches("/config/").to_owned();
            let was = ev.prev_kv().map(|p| p.value_str().unwrap_or("?").to_owned());
            match ev.event_type() {
                etcd_client::EventType::Put => {
                    println!(
                        "{name} = {} (was {}) at revision {}",
                        kv.value_str()?,
                        was.as_deref().unwrap_or("unset"),
                        kv.mod_revision()
                    );
                    config.insert(name, kv.value_str()?.to_owned());
                }
                etcd_client::EventType::Delete => {
                    println!(
                        "{name} removed (was {}) at revision {}",
                        was.as_deref().unwrap_or("?"),
                        kv.mod_revision()
                    );
                    config.remove(&name);
                }
            }
            seen += 1;
        }
    }
    println!("config now: {config:?}");
    let status = cache.status();
    println!(
        "cache: revision {}, {} objects, {} upstream watch(es)",
        status.rv,
        status.store_len,
        cache.upstream_watches()
    );
    cache.close().await;
    Ok(())
}
