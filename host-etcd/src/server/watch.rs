//! etcd's `Watch` service on the wire: each client stream gets a watch session (`session/`);
//! its requests are decoded by tonic's streaming decoder, and its responses written here as
//! gRPC messages, a whole batch (one session wake-up: many watches, many revisions) in one
//! HTTP/2 data frame, cached events from their shared encodings (`wire.rs`).
//!
//! etcd counterpart: `server/etcdserver/api/v3rpc/watch.go` (`Watch`, `sendLoop`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use tonic::Status;

use super::wire::{encode_response, WatchDecoder};
use super::Ctx;
use crate::queue;
use crate::session::driver::{self, OutItem, Outbox};
use crate::upstream::forwardable;

/// Responses written into one data frame at most (more wait for the next poll).
const FRAME_BYTES: usize = 256 << 10;

/// The axum route for `/etcdserverpb.Watch/Watch`.
pub(crate) async fn route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let (parts, body) = req.into_parts();
    let md = forwardable(&tonic::metadata::MetadataMap::from_headers(parts.headers));
    let inbound =
        tonic::codec::Streaming::new_request(WatchDecoder, body, None, Some(ctx.max_request_bytes));
    let (out, rx) = Outbox::new();
    tokio::spawn(driver::run(ctx.env.clone(), md, inbound, out));
    let body = WatchBody { rx, end: None, done: false };
    let mut resp = http::Response::new(tonic::body::Body::new(body));
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    resp
}

/// The response body: the session's batches as gRPC messages, then the trailers with the
/// stream's status.
struct WatchBody {
    rx: queue::Receiver<OutItem>,
    /// The status that ends the stream, once known (sent after the data before it).
    end: Option<Status>,
    done: bool,
}

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut h = http::HeaderMap::new();
    if status.add_header(&mut h).is_err() {
        h.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(h)
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(status) = self.end.take() {
            self.done = true;
            return Poll::Ready(Some(Ok(trailers(&status))));
        }
        let mut buf = BytesMut::new();
        loop {
            let item = if buf.is_empty() {
                match self.rx.poll_recv(cx) {
                    Poll::Ready(item) => item,
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                // What is already queued goes into the same frame.
                match self.rx.try_recv() {
                    Ok(item) => Some(item),
                    Err(_) => break,
                }
            };
            match item {
                Some(OutItem::Batch(batch, _permit)) => {
                    for r in &batch {
                        let start = buf.len();
                        // The gRPC message prefix: not compressed, then the length.
                        buf.put_u8(0);
                        buf.put_u32(0);
                        encode_response(r, &mut buf);
                        let len = (buf.len() - start - 5) as u32;
                        buf[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
                    }
                    if buf.len() >= FRAME_BYTES {
                        break;
                    }
                }
                Some(OutItem::End(status)) => {
                    self.end = Some(*status);
                    break;
                }
                None => {
                    self.end = Some(Status::ok(""));
                    break;
                }
            }
        }
        if buf.is_empty() {
            let status = self.end.take().unwrap_or_else(|| Status::ok(""));
            self.done = true;
            return Poll::Ready(Some(Ok(trailers(&status))));
        }
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}
