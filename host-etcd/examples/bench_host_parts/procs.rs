//! Child processes (killed on every exit path), /proc readings, the machine and its limits,
//! a bare HTTP/1.0 GET, and log scanning.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

// Registered so that every exit path (error, Ctrl-C, SIGTERM) kills them.
static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn register(pid: u32) {
    if let Ok(mut p) = PIDS.lock() {
        p.push(pid);
    }
}

fn unregister(pid: u32) {
    if let Ok(mut p) = PIDS.lock() {
        p.retain(|x| *x != pid);
    }
}

/// SIGKILL to every child still registered (each by its own pid).
pub(crate) fn kill_registered() {
    let pids: Vec<u32> = PIDS.lock().map(|p| p.clone()).unwrap_or_default();
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process (killed when dropped) with its output in a log file.
pub(crate) struct Proc {
    pub(crate) name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    pub(crate) log: PathBuf,
    child: Child,
    pub(crate) pid: u32,
    pub(crate) starts: u32,
}

impl Proc {
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: Vec<(String, String)>,
        log: PathBuf,
    ) -> Result<Proc, String> {
        let child = Self::start(program, &args, &env, &log)?;
        let pid = child.id().ok_or_else(|| format!("{name}: no pid"))?;
        register(pid);
        Ok(Proc {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            env,
            log,
            child,
            pid,
            starts: 1,
        })
    }

    fn start(
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Child, String> {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(logf.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(logf))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().map_err(|e| format!("starting {}: {e}", program.display()))
    }

    /// SIGKILL and wait.
    pub(crate) async fn kill(&mut self) {
        let _ = self.child.kill().await;
        unregister(self.pid);
    }

    /// Starts the (killed) process again with the same command line.
    pub(crate) fn start_again(&mut self) -> Result<(), String> {
        self.child = Self::start(&self.program, &self.args, &self.env, &self.log)?;
        self.pid = self.child.id().ok_or_else(|| format!("{}: no pid", self.name))?;
        register(self.pid);
        self.starts += 1;
        Ok(())
    }

    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => {
                Some(format!("{} exited with {st}; see {}", self.name, self.log.display()))
            }
            _ => None,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        unregister(self.pid);
    }
}

// ---------------------------------------------------------------------------------------------
// /proc readings.

pub(crate) fn clk_tck() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// utime + stime of a process, in ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The sum of several processes' ticks (None if one cannot be read).
pub(crate) fn cpu_ticks_sum(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|p| cpu_ticks(*p)).sum()
}

/// Busy ticks of all CPUs (everything in the `cpu` line of /proc/stat but idle and iowait).
pub(crate) fn system_busy_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    Some(v.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, x)| x).sum())
}

/// utime + stime of every process now, by pid.
pub(crate) fn all_cpu_ticks() -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if let Some(t) = cpu_ticks(pid) {
                    m.insert(pid, t);
                }
            }
        }
    }
    m
}

/// CPU ticks used between two snapshots by processes other than `ours`.
pub(crate) fn others_ticks(a: &BTreeMap<u32, u64>, b: &BTreeMap<u32, u64>, ours: &[u32]) -> u64 {
    b.iter()
        .filter(|(pid, _)| !ours.contains(pid))
        .map(|(pid, t)| t.saturating_sub(a.get(pid).copied().unwrap_or(0)))
        .sum()
}

pub(crate) fn self_cpu_ticks() -> Option<u64> {
    cpu_ticks(std::process::id())
}

/// A field of /proc/PID/status in KiB (VmHWM, VmRSS).
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// The sum of one status field over several processes.
pub(crate) fn status_kib_sum(pids: &[u32], field: &str) -> Option<u64> {
    pids.iter().map(|p| status_kib(*p, field)).sum()
}

/// Resets the peak RSS (VmHWM) to the current RSS.
pub(crate) fn reset_hwm(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// The 1-minute load average and the number of runnable tasks now.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// The commit the binaries were built from and the files that differed from it (this is a
/// working tree; the figures belong to exactly this state).
pub(crate) fn source_state() -> Value {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let commit = git(&["log", "-1", "--format=%h %s"]);
    let dirty: Vec<String> = git(&["status", "--porcelain", "--untracked-files=no"])
        .map(|s| s.lines().map(|l| l.trim().to_owned()).collect())
        .unwrap_or_default();
    json!({"commit": commit, "modified": dirty})
}

pub(crate) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    json!({
        "cpu": model,
        "cores": cores,
        "kernel": kernel,
        "memory_gib": (mem_kib as f64 / 1048576.0 * 10.0).round() / 10.0,
        "loadavg_at_start": loadavg(),
    })
}

// ---------------------------------------------------------------------------------------------
// Limits: open files (raised to the hard limit for us and the children we start) and the
// kernel's socket limits that many connections meet.

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
    fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
}

/// RLIMIT_NOFILE on Linux.
const RLIMIT_NOFILE: i32 = 7;

/// Raises the soft limit on open files to the hard limit; returns (soft, hard) after.
pub(crate) fn raise_nofile() -> Option<(u64, u64)> {
    let mut r = RLimit { cur: 0, max: 0 };
    // SAFETY: getrlimit/setrlimit from the C library with a valid, properly laid out struct
    // (rlim_t is 64 bits on Linux).
    unsafe {
        if getrlimit(RLIMIT_NOFILE, &mut r) != 0 {
            return None;
        }
        if r.cur < r.max {
            let want = RLimit { cur: r.max, max: r.max };
            if setrlimit(RLIMIT_NOFILE, &want) == 0 {
                r.cur = r.max;
            }
        }
    }
    Some((r.cur, r.max))
}

/// The kernel settings that bound many loopback connections.
pub(crate) fn kernel_limits(nofile: Option<(u64, u64)>) -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).ok()
    };
    json!({
        "nofile_soft_hard": nofile.map(|(s, h)| vec![s, h]),
        "fs.file-max": read("/proc/sys/fs/file-max"),
        "net.ipv4.ip_local_port_range": read("/proc/sys/net/ipv4/ip_local_port_range"),
        "net.core.somaxconn": read("/proc/sys/net/core/somaxconn"),
        "net.ipv4.tcp_max_syn_backlog": read("/proc/sys/net/ipv4/tcp_max_syn_backlog"),
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP (metrics, readiness) without a client library: HTTP/1.0, the server closes.

pub(crate) async fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("no HTTP status from {addr}{path}"))?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| format!("GET {addr}{path} timed out"))?
}

// ---------------------------------------------------------------------------------------------
// Logs.

/// Warnings, errors and panics in a log (JSON or text).
pub(crate) fn tail_problems(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(strip_ansi)
        .filter(|l| {
            let json_level = [
                "\"level\":\"warn\"",
                "\"level\":\"error\"",
                "\"level\":\"panic\"",
                "\"level\":\"fatal\"",
            ];
            json_level.iter().any(|p| l.contains(p))
                || l.contains(" WARN ")
                || l.contains(" ERROR ")
                || l.contains("panicked")
        })
        .map(|mut s| {
            s.truncate(300);
            s
        })
        .collect()
}

fn strip_ansi(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut chars = l.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
