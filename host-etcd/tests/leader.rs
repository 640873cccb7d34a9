//! etcd's require-leader flag (clientv3's `WithRequireLeader`, the `hasleader` metadata, which
//! kube-apiserver sets on every watch): an etcd member that has had no leader for three election
//! timeouts ends its require-leader streams with `etcdserver: no leader`, and refuses new ones
//! (and require-leader unary calls) while it has none, so that the client can go to another
//! member instead of watching one cut off from the cluster. Its other streams go on.
//!
//! The test starts a cluster of three etcd members, watchcache in front of the first, and the
//! same watches on the first member directly and through watchcache; then stops the other two
//! members and requires the same answers from both, then starts them again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, WatchOptions, WatchStream};
use host_etcd::Server;
use tokio::process::{Child, Command};

use crate::support;

/// One member of a cluster started by the test.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

fn etcd_binary() -> PathBuf {
    std::env::var_os("WATCHCACHE_ETCD_BIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/etcd"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port()
}

impl Member {
    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Starts (or starts again, on its data) with short election timeouts: a member without a
    /// leader ends its require-leader streams about 1 s after it lost it.
    fn start(&mut self, cluster: &str, state: &str) {
        let child = Command::new(etcd_binary())
            .arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", self.dir.path().join("data").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{}", self.client_port))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{}", self.client_port))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", self.peer_port))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{}", self.peer_port))
            .arg(format!("--initial-cluster={cluster}"))
            .arg(format!("--initial-cluster-state={state}"))
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=300")
            .arg("--log-level=error")
            .stdout(std::process::Stdio::null())
            .stderr(self.log())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", etcd_binary().display()));
        self.child = Some(child);
    }

    /// etcd's log (errors only), appended to over restarts.
    fn log(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd log")
    }

    async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}

/// Starts a cluster of `n` members and waits for its leader. The ports are free when picked but
/// not held, so another test's connection can take one before etcd binds it (the member then
/// exits at once): a cluster without a leader after 15 s is started again on new ports, three
/// times at most.
async fn start_cluster(n: usize) -> (Vec<Member>, String) {
    for attempt in 1..=3 {
        let mut members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                dir: tempfile::tempdir().expect("tempdir"),
                child: None,
            })
            .collect();
        let cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        for m in members.iter_mut() {
            m.start(&cluster, "new");
        }
        let mut led = true;
        for m in &members {
            led = led && has_leader_within(&m.endpoint(), Duration::from_secs(15)).await;
        }
        if led {
            return (members, cluster);
        }
        eprintln!("attempt {attempt}: the cluster on {cluster} has no leader after 15 s");
        for m in members.iter_mut() {
            m.stop().await;
            let log = std::fs::read_to_string(m.dir.path().join("etcd.log")).unwrap_or_default();
            eprintln!("{}'s log:\n{}", m.name, log.lines().take(20).collect::<Vec<_>>().join("\n"));
        }
    }
    panic!("no etcd cluster with a leader in 3 attempts");
}

/// Waits until the member at `ep` knows a leader.
async fn wait_leader(ep: &str, limit: Duration) {
    assert!(has_leader_within(ep, limit).await, "{ep} has no leader after {limit:?}");
}

/// Whether the member at `ep` knows a leader within `limit`.
async fn has_leader_within(ep: &str, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        if let Ok(mut c) = Client::connect([ep], None).await {
            if let Ok(s) = c.status().await {
                if s.leader() != 0 {
                    return true;
                }
            }
        }
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn client(ep: &str, require_leader: bool) -> Client {
    let opts = ConnectOptions::new().with_require_leader(require_leader);
    Client::connect([ep], Some(opts)).await.expect("connect")
}

/// The next response of a watch, or its error, within `limit` (`None`: nothing came).
async fn next(s: &mut WatchStream, limit: Duration) -> Option<Result<Vec<i64>, String>> {
    match tokio::time::timeout(limit, s.message()).await {
        Err(_) => None,
        Ok(Ok(Some(r))) => {
            Some(Ok(r.events().iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).collect()))
        }
        Ok(Ok(None)) => Some(Err("stream ended".into())),
        Ok(Err(e)) => Some(Err(e.to_string())),
    }
}

/// A watch of `/l/` from now, waited for until created.
async fn watch(c: &mut Client) -> Result<WatchStream, String> {
    let mut s =
        c.watch("/l/", Some(WatchOptions::new().with_prefix())).await.map_err(|e| e.to_string())?;
    match s.message().await {
        Ok(Some(r)) if r.created() => Ok(s),
        Ok(r) => Err(format!("no created: {r:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_leader_streams_end_as_etcds_when_its_member_has_no_leader() {
    support::init_tracing();
    let (mut members, cluster) = start_cluster(3).await;
    let mut cfg = host_etcd::ServeConfig::default();
    cfg.upstream.endpoints = vec![members[0].endpoint()];
    cfg.listen_grpc = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.prefixes = vec![b"/l/".to_vec()];
    cfg.listen_http = None;
    let server = Server::start(cfg).await.expect("watchcache");
    assert!(server.wait_ready(Duration::from_secs(10)).await, "cache not ready");
    let (etcd_ep, wc_ep) = (members[0].endpoint(), server.grpc_addr().to_string());

    // Each side: a require-leader watch and one without.
    let mut sides = Vec::new();
    for ep in [&etcd_ep, &wc_ep] {
        let (mut rl, mut plain) = (client(ep, true).await, client(ep, false).await);
        let a = watch(&mut rl).await.expect("require-leader watch");
        let b = watch(&mut plain).await.expect("plain watch");
        sides.push((rl, plain, a, b));
    }
    let rev = client(&etcd_ep, false).await.put("/l/a", "1", None).await.expect("put");
    let rev = rev.header().expect("header").revision();
    for (_, _, a, b) in sides.iter_mut() {
        assert_eq!(next(a, Duration::from_secs(5)).await, Some(Ok(vec![rev])));
        assert_eq!(next(b, Duration::from_secs(5)).await, Some(Ok(vec![rev])));
    }

    // The other two members stop: the first has no leader from about 300 ms on.
    members[1].stop().await;
    members[2].stop().await;
    let lost = Instant::now();
    let mut ended = Vec::new();
    for (side, (_, _, a, _)) in ["etcd", "watchcache"].iter().zip(sides.iter_mut()) {
        let got = next(a, Duration::from_secs(15)).await;
        ended.push(got.clone());
        eprintln!("{side}: the require-leader watch ended after {:?}: {got:?}", lost.elapsed());
    }
    assert_eq!(ended[0], ended[1], "etcd's require-leader watch against watchcache's");
    assert!(
        matches!(&ended[0], Some(Err(e)) if e.contains("etcdserver: no leader")),
        "etcd ended it: {:?}",
        ended[0]
    );
    // The watches without the flag go on, on both sides.
    for (side, (_, _, _, b)) in ["etcd", "watchcache"].iter().zip(sides.iter_mut()) {
        assert_eq!(next(b, Duration::from_millis(500)).await, None, "{side}: the plain watch");
    }
    // While there is no leader, a new require-leader watch and a require-leader read are
    // refused alike; the same without the flag are served (the read: serializable).
    let mut answers = Vec::new();
    for (rl, plain, _, _) in sides.iter_mut() {
        let w = watch(rl).await.err();
        let r = rl.get("/l/a", Some(GetOptions::new().with_serializable())).await.err();
        let p = plain
            .get("/l/a", Some(GetOptions::new().with_serializable()))
            .await
            .map(|r| r.kvs().len());
        answers.push((w, r.map(|e| e.to_string()), p.map_err(|e| e.to_string())));
    }
    eprintln!("while no leader: etcd {:?}, watchcache {:?}", answers[0], answers[1]);
    assert_eq!(answers[0], answers[1], "etcd's answers against watchcache's");
    assert!(answers[0].0.as_deref().is_some_and(|e| e.contains("no leader")), "{:?}", answers[0]);

    // The members come back: require-leader watches work again on both sides.
    members[1].start(&cluster, "existing");
    members[2].start(&cluster, "existing");
    wait_leader(&etcd_ep, Duration::from_secs(30)).await;
    let back = Instant::now();
    for (side, (rl, _, _, _)) in ["etcd", "watchcache"].iter().zip(sides.iter_mut()) {
        let mut w = loop {
            match watch(rl).await {
                Ok(w) => break w,
                Err(e) if back.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = e;
                }
                Err(e) => {
                    panic!("{side}: no require-leader watch 10 s after the leader is back: {e}")
                }
            }
        };
        eprintln!("{side}: a require-leader watch again {:?} after the leader", back.elapsed());
        let rev = client(&etcd_ep, false).await.put("/l/b", *side, None).await.expect("put");
        let rev = rev.header().expect("header").revision();
        assert_eq!(next(&mut w, Duration::from_secs(5)).await, Some(Ok(vec![rev])), "{side}");
    }
    for m in members.iter_mut() {
        m.stop().await;
    }
}
