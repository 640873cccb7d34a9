//! Starting a real etcd: the server's embedded default, and the tests' and benchmarks' fixture.
//!
//! etcd runs as a child process on free loopback ports in a temporary directory, and is killed
//! (and its directory removed) when the handle is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// Where etcd binaries are looked for: `$WATCHCACHE_ETCD_BIN`, the project's `.tools/bin`
/// (where `make` builds etcd 3.7 from its Go modules), then `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let env = if name == "etcd" { "WATCHCACHE_ETCD_BIN" } else { "WATCHCACHE_ETCDCTL_BIN" };
    if let Some(p) = std::env::var_os(env).map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            candidates.push(dir.join(".tools/bin").join(name));
        }
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin").join(name));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join(name)));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// A free loopback TCP port (bound and released; good enough for tests and the embedded
/// default).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Options of a launched etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// `--watch-progress-notify-interval` (etcd's default is 10 minutes).
    pub progress_notify_interval: Option<Duration>,
    /// Extra command-line flags.
    pub extra_args: Vec<String>,
    /// Reuse this data directory (to restart an etcd with its data); a new temporary one if
    /// `None`.
    pub data_dir: Option<PathBuf>,
    /// Reuse these ports (client, peer) after a restart.
    pub ports: Option<(u16, u16)>,
}

/// A running etcd child process.
pub struct EmbeddedEtcd {
    child: Child,
    /// Holds the temporary data directory (removed on drop) unless one was given.
    _dir: Option<tempfile::TempDir>,
    data_dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    binary: PathBuf,
}

impl EmbeddedEtcd {
    /// Starts etcd and waits until it serves (at most 30 s).
    pub async fn start(opts: EtcdOptions) -> Result<EmbeddedEtcd, String> {
        let binary = find_binary("etcd").ok_or_else(|| {
            "etcd not found: run `make setup-etcd` (builds etcd 3.7 from its Go modules into .tools/bin), \
             or put etcd on PATH, or set WATCHCACHE_ETCD_BIN"
                .to_owned()
        })?;
        let (dir, data_dir) = match &opts.data_dir {
            Some(d) => (None, d.clone()),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("watchcache-etcd-")
                    .tempdir()
                    .map_err(|e| e.to_string())?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let (client_port, peer_port) = match opts.ports {
            Some(p) => p,
            None => {
                (free_port().map_err(|e| e.to_string())?, free_port().map_err(|e| e.to_string())?)
            }
        };
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(&binary);
        cmd.arg("--name")
            .arg("watchcache")
            .arg("--data-dir")
            .arg(data_dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("watchcache={peer}"))
            .arg("--logger=zap")
            .arg("--log-level=error");
        if let Some(i) = opts.progress_notify_interval {
            cmd.arg(format!("--watch-progress-notify-interval={}ms", i.as_millis()));
        }
        cmd.args(&opts.extra_args);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let mut etcd = EmbeddedEtcd { child, _dir: dir, data_dir, client_port, peer_port, binary };
        etcd.wait_ready(Duration::from_secs(30)).await?;
        Ok(etcd)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        let url = self.endpoint();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let _ = e.read_to_string(&mut err).await;
                }
                return Err(format!("etcd exited with {status}: {err}"));
            }
            if let Ok(mut c) = etcd_client::Client::connect([url.as_str()], None).await {
                // With auth on, an anonymous status is refused: etcd answered all the same.
                match c.status().await {
                    Ok(_) => return Ok(()),
                    Err(etcd_client::Error::GRpcStatus(s))
                        if matches!(
                            s.code(),
                            tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
                        ) =>
                    {
                        return Ok(())
                    }
                    Err(_) => {}
                }
            }
            if start.elapsed() > limit {
                return Err(format!("etcd did not become ready within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `127.0.0.1:PORT` of the client URL.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The data directory (to restart with the same data).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The etcd binary in use.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The OS process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills etcd (SIGKILL) and waits for it; the data directory stays until drop.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Kills etcd and starts it again on the same ports with the same data.
    pub async fn restart(&mut self, opts: EtcdOptions) -> Result<(), String> {
        self.kill().await;
        let mut opts = opts;
        opts.data_dir = Some(self.data_dir.clone());
        opts.ports = Some((self.client_port, self.peer_port));
        let mut fresh = EmbeddedEtcd::start(opts).await?;
        // Keep our temporary directory; adopt the new child.
        std::mem::swap(&mut self.child, &mut fresh.child);
        Ok(())
    }
}
