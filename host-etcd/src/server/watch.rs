//! etcd's `Watch` service on the wire: each client stream gets a watch session (`session/`),
//! run by the stream's response body itself (no task of its own); its requests are decoded by
//! tonic's streaming decoder, and its responses written here as gRPC messages, everything one
//! poll takes (many watches, many revisions) in one HTTP/2 data frame, cached events from their
//! shared encodings (`wire.rs`).
//!
//! etcd counterpart: `server/etcdserver/api/v3rpc/watch.go` (`Watch`, `sendLoop`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use tonic::codec::Streaming;
use tonic::Status;

use super::wire::{encode_response, ReceiveLimit, WatchDecoder};
use super::Ctx;
use crate::session::driver::SessionDriver;
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
    let limit = ctx.etcd_receive_limit();
    let body = ReceiveLimit::new(body, limit);
    let inbound = Streaming::new_request(WatchDecoder, body, None, Some(limit));
    let mut driver = SessionDriver::new(ctx.env.clone(), md, inbound);
    std::future::poll_fn(|cx| {
        driver.poll_start(cx);
        Poll::Ready(())
    })
    .await;
    let body = WatchBody { driver, done: false };
    let mut resp = http::Response::new(tonic::body::Body::new(body));
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    resp
}

/// The response body, which runs the stream's session ([`SessionDriver`]): what it answers as
/// gRPC messages, then the trailers with the stream's status. Dropped when the client goes
/// away, which ends the session.
struct WatchBody {
    driver: SessionDriver<Streaming<etcd_client::proto::PbWatchRequest>>,
    /// The trailers have gone.
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
        let mut buf = BytesMut::new();
        let polled = self.driver.poll_responses(cx, FRAME_BYTES, |r, waiting| {
            if buf.is_empty() {
                // What waits is counted roughly (the events' sizes): room for it in one go.
                buf.reserve(waiting.min(FRAME_BYTES) * 5 / 4 + 64);
            }
            let start = buf.len();
            // The gRPC message prefix: not compressed, then the length.
            buf.put_u8(0);
            buf.put_u32(0);
            encode_response(&r, &mut buf);
            let len = (buf.len() - start - 5) as u32;
            buf[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
        });
        match polled {
            Poll::Ready(Ok(())) => Poll::Ready(Some(Ok(Frame::data(buf.freeze())))),
            Poll::Ready(Err(status)) => {
                self.done = true;
                Poll::Ready(Some(Ok(trailers(&status))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
