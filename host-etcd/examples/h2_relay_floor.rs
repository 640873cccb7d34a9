//! A bare HTTP/2 relay: hyper's server in front, one hyper HTTP/2 client connection behind,
//! every request forwarded with its method, path and headers and nothing else on the path (no
//! routing, no tonic, no write batching). What watchcache's pass-through would cost if it were
//! only HTTP/2.
//!
//! `h2_relay_floor LISTEN UPSTREAM [WORKERS]` (WORKERS 0 = a current-thread runtime), then
//! `passthrough_latency --target etcd=UPSTREAM --target relay=LISTEN`.

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().expect("LISTEN");
    let upstream = args.next().expect("UPSTREAM");
    let workers: usize = args.next().map(|s| s.parse().expect("WORKERS")).unwrap_or(2);
    let rt = if workers == 0 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()
    }
    .expect("runtime");
    rt.block_on(run(listen, upstream));
}

async fn run(listen: String, upstream: String) {
    let up = TcpStream::connect(&upstream).await.expect("upstream");
    up.set_nodelay(true).expect("nodelay");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(up))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let l = TcpListener::bind(&listen).await.expect("bind");
    loop {
        let (s, _) = l.accept().await.expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let send = send.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut send = send.clone();
                let uri = format!("http://{upstream}{}", req.uri().path());
                async move {
                    let (parts, body) = req.into_parts();
                    let mut b = hyper::Request::builder().method(parts.method).uri(uri);
                    for (k, v) in parts.headers.iter() {
                        b = b.header(k, v);
                    }
                    let up = b.body(body).expect("request");
                    let r = send.send_request(up).await?;
                    Ok::<_, hyper::Error>(r.map(|b| b.boxed()))
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}
