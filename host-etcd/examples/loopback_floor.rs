//! The floor under issue 14's pass-through target: what one more process on the path costs on
//! this machine, with nothing of gRPC, HTTP/2 or tokio in it.
//!
//! Three processes of this binary: an echo server, a relay in front of it (one blocking thread
//! per connection, which forwards each 64-byte message and its answer, the least a proxy can
//! do), and a client that times round trips to the echo server directly and through the relay,
//! alternating in rounds of 100 (2 000 each), TCP_NODELAY everywhere, on loopback.
//!
//! `cargo run --release -p host-etcd --example loopback_floor` (it starts the other two itself).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const MSG: usize = 64;

fn echo(l: TcpListener) {
    for s in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut s = s;
            let _ = s.set_nodelay(true);
            let mut b = [0u8; MSG];
            while s.read_exact(&mut b).is_ok() {
                if s.write_all(&b).is_err() {
                    return;
                }
            }
        });
    }
}

fn relay(l: TcpListener, to: String) {
    for c in l.incoming().flatten() {
        let Ok(mut up) = TcpStream::connect(&to) else { continue };
        std::thread::spawn(move || {
            let mut c = c;
            let _ = c.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let mut b = [0u8; MSG];
            while c.read_exact(&mut b).is_ok() {
                if up.write_all(&b).is_err() || up.read_exact(&mut b).is_err() {
                    return;
                }
                if c.write_all(&b).is_err() {
                    return;
                }
            }
        });
    }
}

fn round_trips(addr: &str, n: usize, out: &mut Vec<Duration>) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut b = [7u8; MSG];
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        out.push(t.elapsed());
    }
    Ok(())
}

fn percentile(v: &mut [Duration], p: f64) -> u128 {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize].as_micros()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// Kills the helper processes when the client is done.
struct Helpers(Vec<Child>);

impl Drop for Helpers {
    fn drop(&mut self) {
        for c in self.0.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("echo") => {
            if let Ok(l) = TcpListener::bind(&args[2]) {
                echo(l);
            }
        }
        Some("relay") => {
            if let Ok(l) = TcpListener::bind(&args[2]) {
                relay(l, args[3].clone());
            }
        }
        _ => {
            let me = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => return eprintln!("loopback_floor: {e}"),
            };
            let (e, r) =
                (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
            let mut helpers = Helpers(Vec::new());
            for a in [vec!["echo", e.as_str()], vec!["relay", r.as_str(), e.as_str()]] {
                match Command::new(&me).args(&a).spawn() {
                    Ok(c) => helpers.0.push(c),
                    Err(err) => return eprintln!("loopback_floor: starting {a:?}: {err}"),
                }
            }
            std::thread::sleep(Duration::from_millis(300));
            let (mut direct, mut relayed) = (Vec::new(), Vec::new());
            for _ in 0..20 {
                if let Err(err) = round_trips(&e, 100, &mut direct)
                    .and_then(|()| round_trips(&r, 100, &mut relayed))
                {
                    return eprintln!("loopback_floor: {err}");
                }
            }
            let (d50, d90) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.9));
            let (r50, r90) = (percentile(&mut relayed, 0.5), percentile(&mut relayed, 0.9));
            println!("round trip, 64 bytes, {} each:", direct.len());
            println!("  direct          p50 {d50:>4} µs  p90 {d90:>4} µs");
            println!("  through a relay p50 {r50:>4} µs  p90 {r90:>4} µs");
            println!(
                "  one more hop    p50 +{} µs  p90 +{} µs",
                r50.saturating_sub(d50),
                r90.saturating_sub(d90)
            );
        }
    }
}
