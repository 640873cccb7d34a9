//! `watchcache`: the Kubernetes watch cache in front of etcd, speaking etcd's gRPC API.
//!
//! `watchcache serve` (with no `--etcd-endpoints`, an embedded etcd is started),
//! `watchcache replay FILE` (a scenario's trace, from the core's replayer),
//! `watchcache simulate FILE` (a workload's report, from the core's simulator).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use host_etcd::{
    parse_duration, EmbeddedEtcd, EtcdOptions, EtcdTls, ServeConfig, Server, ServerTls,
};
use tracing::{error, info};

/// mimalloc for the server: many small, short-lived allocations per delivery, and memory given
/// back after a burst (glibc's arenas kept a slow-reader burst's peak resident).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "watchcache",
    version,
    about = "The Kubernetes watch cache in front of etcd, speaking etcd's gRPC API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve etcd's gRPC API (and HTTP) from a watch cache in front of etcd.
    Serve(Box<ServeArgs>),
    /// Replay a scenario file and print its trace (a JSON array of records, as the goldens).
    Replay {
        /// The scenario (JSON).
        file: PathBuf,
    },
    /// Simulate a workload (writes, watchers, disconnects, compactions, restarts) against the
    /// cache core in simulated time and print the report (JSON: summary, then one record per
    /// second). Examples in scenarios/simulate/.
    Simulate {
        /// The workload (JSON).
        file: PathBuf,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// etcd members, HOST:PORT or URL, comma-separated. Without it, an embedded etcd is started
    /// from .tools/bin or PATH on free loopback ports in a temporary directory.
    #[arg(long, value_delimiter = ',', env = "WATCHCACHE_ETCD_ENDPOINTS")]
    etcd_endpoints: Vec<String>,
    /// Address for etcd gRPC clients.
    #[arg(long, default_value = "127.0.0.1:2479")]
    listen_grpc: SocketAddr,
    /// Address for HTTP (metrics, health, debug, Kubernetes-style API, the demo).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen_http: SocketAddr,
    /// A key prefix to cache (repeat for several; one cache each).
    #[arg(long = "prefix", default_value = "/")]
    prefixes: Vec<String>,
    /// The Kubernetes behaviour to follow: v1.30, v1.34 or v1.37.
    #[arg(long, default_value = "v1.34")]
    profile: String,
    /// Dispatch as Kubernetes does: a watcher whose queue is full holds up every other
    /// watcher's events for up to the time budget (kubernetes#141450). Off: it waits alone.
    #[arg(long)]
    stall_dispatch: bool,
    /// How long after the upstream watch broke the cache relists (Kubernetes: 1s).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    relist_delay: std::time::Duration,
    /// Initial ring-buffer capacity (Kubernetes: 100).
    #[arg(long)]
    capacity: Option<usize>,
    /// Largest ring-buffer capacity (Kubernetes: 102400).
    #[arg(long)]
    upper_bound_capacity: Option<usize>,
    /// Most bytes of events the ring holds (key, new and previous value per event): beyond it
    /// the window shrinks from the front whatever the capacity, and watches from revisions it
    /// dropped go to etcd (`watchcache_ring_byte_evictions_total`). Default: no byte bound.
    #[arg(long)]
    max_cache_bytes: Option<u64>,
    /// Fixed capacity: no dynamic resizing.
    #[arg(long)]
    fixed_capacity: bool,
    /// Bookmark frequency for Kubernetes-style watches (Kubernetes: 1m).
    #[arg(long, value_parser = parse_duration)]
    bookmark_frequency: Option<std::time::Duration>,
    /// Field used as the trigger index for Kubernetes-style watches (e.g. spec.nodeName).
    #[arg(long)]
    index_field: Option<String>,
    /// Events a gRPC watcher may have in flight before the cache holds them for it.
    #[arg(long, default_value_t = 256)]
    grpc_credit: u64,
    /// Events queued per gRPC watcher before it falls behind and is replayed from the ring.
    #[arg(long, default_value_t = 256)]
    grpc_queue: usize,
    /// On each (re)list, load this many revisions of etcd's history into the window first, so
    /// watchers resuming from them after a restart are served from memory (0: list at the
    /// current revision only, as Kubernetes does).
    #[arg(long, default_value_t = 10_000)]
    backfill_revisions: u64,
    /// Where a linearizable read learns etcd's current revision: `auto` (from a watcher
    /// created on the cache's own watch stream when etcd is one voting member, a quorum read
    /// otherwise) or `quorum` (always a quorum read of one key, as Kubernetes).
    #[arg(long, default_value = "auto")]
    freshness: String,
    /// The shortest time between two sends of events to the watch streams: under load, events
    /// that come sooner are gathered and sent together at most this much later (each stream
    /// then wakes once for several revisions); an event after a quiet spell goes at once.
    /// 0ms sends every revision as soon as the cache has it.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    delivery_coalesce: std::time::Duration,
    /// etcd's `--max-request-bytes` (the etcd cluster's own; etcd's default 1 572 864): a watch
    /// created with `fragment` is cut where etcd would cut it, and RangeStream's chunks are as
    /// large as etcd's.
    #[arg(long, default_value_t = host_etcd::config::ETCD_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Idle watches that asked for progress notify get one this often (etcd: 10m).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    progress_notify_interval: std::time::Duration,
    /// CA (PEM) that signed etcd's server certificate.
    #[arg(long)]
    etcd_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd.
    #[arg(long, requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for etcd.
    #[arg(long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// etcd user for the cache's own list and watch.
    #[arg(long, env = "WATCHCACHE_ETCD_USER", requires = "etcd_password")]
    etcd_user: Option<String>,
    /// etcd password.
    #[arg(long, env = "WATCHCACHE_ETCD_PASSWORD", requires = "etcd_user")]
    etcd_password: Option<String>,
    /// Server certificate (PEM) for TLS to gRPC clients.
    #[arg(long, requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// Server key (PEM).
    #[arg(long, requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// Only accept gRPC clients with a certificate from this CA (PEM).
    #[arg(long, requires = "cert_file")]
    client_ca_file: Option<PathBuf>,
    /// How long the start waits for etcd to answer (a refused connection, etcd starting or
    /// without a leader) before watchcache exits; 0s: as long as it takes. Other failures
    /// (TLS material, credentials) end it at once.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    etcd_start_timeout: std::time::Duration,
    /// How long an etcd permission decision is reused for cached reads.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    auth_cache_ttl: std::time::Duration,
    /// Directory of the web demo's files (served over HTTP when it exists).
    #[arg(long, default_value = "web-demo/dist")]
    web_dir: PathBuf,
    /// Threads that run the server's tasks (tokio's workers). Default: one per CPU, or
    /// `TOKIO_WORKER_THREADS`. The cache's own work is one task per prefix whatever the
    /// count (BENCHMARKS.md measures one thread against two on two CPUs).
    #[arg(long, env = "WATCHCACHE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=4096))]
    worker_threads: Option<u16>,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn config(a: &ServeArgs) -> Result<ServeConfig, String> {
    let mut cfg = ServeConfig::default();
    let profile =
        cacher_core::Profile::parse(&a.profile).map_err(|e| format!("--profile: {}", e.message))?;
    let mut core = host_etcd::config::host_core_config(profile);
    core.non_blocking_dispatch = !a.stall_dispatch;
    core.relist_delay_ms = a.relist_delay.as_millis() as u64;
    if let Some(c) = a.capacity {
        core.capacity = c;
        core.lower_bound_capacity = core.lower_bound_capacity.min(c);
    }
    if let Some(c) = a.upper_bound_capacity {
        core.upper_bound_capacity = c;
    }
    core.max_cache_bytes = a.max_cache_bytes;
    if a.fixed_capacity {
        core.dynamic_capacity = false;
    }
    if let Some(b) = a.bookmark_frequency {
        core.bookmark_frequency_ms = b.as_millis() as u64;
    }
    core.index_field = a.index_field.clone().map(String::into_boxed_str);
    core.validate().map_err(|e| format!("--{}: {}", e.field.replace('_', "-"), e.message))?;
    cfg.cache.core = core;
    cfg.cache.grpc_credit = a.grpc_credit.max(1);
    cfg.cache.grpc_queue = a.grpc_queue.max(1);
    cfg.listen_grpc = a.listen_grpc;
    cfg.listen_http = Some(a.listen_http);
    cfg.prefixes = a.prefixes.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg.cache.progress_notify_interval = a.progress_notify_interval;
    cfg.cache.delivery_coalesce = a.delivery_coalesce;
    cfg.cache.max_request_bytes = a.max_request_bytes;
    cfg.cache.reflector.backfill_revisions = a.backfill_revisions;
    cfg.cache.freshness = host_etcd::config::Freshness::parse(&a.freshness)?;
    cfg.auth_cache_ttl = a.auth_cache_ttl;
    cfg.etcd_start_timeout = Some(a.etcd_start_timeout).filter(|t| !t.is_zero());
    cfg.web_dir = Some(a.web_dir.clone());
    cfg.upstream.endpoints = a.etcd_endpoints.clone();
    if a.etcd_cacert.is_some() || a.etcd_cert.is_some() {
        cfg.upstream.tls = Some(EtcdTls {
            ca_pem: a.etcd_cacert.as_ref().map(read).transpose()?,
            identity_pem: match (&a.etcd_cert, &a.etcd_key) {
                (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                _ => None,
            },
        });
    }
    if let (Some(u), Some(p)) = (&a.etcd_user, &a.etcd_password) {
        cfg.upstream.user = Some((u.clone(), p.clone()));
    }
    if let (Some(c), Some(k)) = (&a.cert_file, &a.key_file) {
        cfg.tls = Some(ServerTls {
            cert_pem: read(c)?,
            key_pem: read(k)?,
            client_ca_pem: a.client_ca_file.as_ref().map(read).transpose()?,
        });
    }
    Ok(cfg)
}

async fn serve(a: ServeArgs) -> Result<(), String> {
    let mut cfg = config(&a)?;
    let mut embedded = None;
    if cfg.upstream.endpoints.is_empty() {
        let etcd = EmbeddedEtcd::start(EtcdOptions::default()).await?;
        info!(
            endpoint = %etcd.endpoint(),
            binary = %etcd.binary().display(),
            data_dir = %etcd.data_dir().display(),
            "no --etcd-endpoints: started an embedded etcd on a free loopback port in a temporary directory; it stops when watchcache does"
        );
        cfg.upstream.endpoints = vec![etcd.endpoint()];
        embedded = Some(etcd);
    }
    let server = Server::start(cfg).await?;
    info!(grpc = %server.grpc_addr(), http = ?server.http_addr(), "ready for etcd clients");
    wait_for_signal().await;
    info!("shutting down");
    server.shutdown().await;
    if let Some(mut etcd) = embedded {
        etcd.kill().await;
        info!("embedded etcd stopped");
    }
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay { file } => {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            match cacher_core::replay::replay_str(&text) {
                Ok(trace) => {
                    print!("{}", cacher_core::replay::trace_to_json(&trace));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    ExitCode::from(1)
                }
            }
        }
        Command::Simulate { file } => {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            match cacher_core::simulate::simulate_str(&text) {
                Ok(report) => {
                    // The series is long: a reader that stops early (`| head`) is not an error.
                    let json = cacher_core::simulate::report_to_json(&report);
                    let _ =
                        std::io::Write::write_all(&mut std::io::stdout().lock(), json.as_bytes());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    ExitCode::from(1)
                }
            }
        }
        Command::Serve(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                .init();
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.enable_all();
            if let Some(n) = args.worker_threads {
                builder.worker_threads(n.into());
            }
            // Tasks in wake order (see .cargo/config.toml); WATCHCACHE_TOKIO_LIFO=1 keeps
            // tokio's default, for comparison.
            #[cfg(tokio_unstable)]
            if std::env::var("WATCHCACHE_TOKIO_LIFO").as_deref() != Ok("1") {
                builder.disable_lifo_slot();
            }
            let rt = match builder.build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("starting the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match rt.block_on(serve(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e}");
                    eprintln!("watchcache: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
