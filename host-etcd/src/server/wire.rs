//! etcd's wire format at the server's edge: a cached event is encoded once per option set
//! (`convert::encode_event_field`, inside its shared run, `cache/delivery.rs`), and each
//! watcher's response is framed from those bytes: its own header and watch id, then the shared
//! events. The Watch stream's request decoder, and etcd's limit on a request message's size.
//!
//! etcd counterparts: `api/etcdserverpb/rpc.proto` (`WatchResponse`); the framing replaces
//! what `server/etcdserver/api/v3rpc/watch.go`'s `sendLoop` builds per watcher.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use etcd_client::proto::PbWatchRequest;
use http_body::{Body, Frame};
use prost::Message;
use tonic::codec::{DecodeBuf, Decoder};
use tonic::Status;

use crate::convert::encode_event_field;
#[cfg(test)]
use crate::convert::pb_event;
use crate::session::{EventsResponse, Response};

/// Writes a cached events response: header, watch id, then each event's shared encoding.
pub fn encode_events(e: &EventsResponse, dst: &mut impl BufMut) {
    // Every watcher of a run gets the same header: encoded once.
    dst.put_slice(e.run.header_encoding(|| {
        let mut b = BytesMut::with_capacity(32);
        prost::encoding::message::encode(1, &e.header, &mut b);
        b.freeze()
    }));
    if e.watch_id != 0 {
        prost::encoding::int64::encode(2, &e.watch_id, dst);
    }
    if e.fragment {
        prost::encoding::bool::encode(7, &true, dst);
    }
    for i in e.picks.iter() {
        dst.put_slice(e.run.encoding(i, e.prev_kv, encode_event_field));
    }
}

/// Writes a session's response: a typed one with prost, cached events from their shared
/// encodings.
pub fn encode_response(r: &Response, dst: &mut impl BufMut) {
    match r {
        Response::Message(m) => {
            // Writing into a growable buffer cannot fail.
            let _ = m.encode(dst);
        }
        Response::Events(e) => encode_events(e, dst),
    }
}

/// Decodes the Watch stream's requests with prost (tonic's streaming decoder drives it).
#[derive(Debug)]
pub struct WatchDecoder;

impl Decoder for WatchDecoder {
    type Item = PbWatchRequest;
    type Error = Status;

    /// Watch requests are small: a small first buffer per stream (tonic's default is 8 KiB,
    /// most of a stream's memory).
    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        tonic::codec::BufferSettings::new(512, 32 << 10)
    }

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<PbWatchRequest>, Status> {
        PbWatchRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("grpc: error unmarshalling request: {e}")))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What etcd's gRPC server takes above `--max-request-bytes` (`server/config/config.go`,
/// `grpcOverheadBytes`): its receive limit is the sum (`MaxRecvMsgSize`).
pub const GRPC_OVERHEAD_BYTES: usize = 512 << 10;

/// A gRPC request body that ends, as etcd's server (grpc-go) ends it, at the header of a
/// message longer than `limit`: `ResourceExhausted`, in grpc-go's words, before any of it is
/// read. tonic's own limit would answer `OutOfRange` in its words, which an etcd client
/// could tell apart. Every other frame and error goes through unchanged.
pub struct ReceiveLimit<B> {
    body: B,
    limit: usize,
    /// The current message header's bytes read so far (a header can span frames).
    header: [u8; 5],
    header_read: usize,
    /// The bytes of the current message still to come.
    left: usize,
}

impl<B> ReceiveLimit<B> {
    /// `body`, with messages of at most `limit` bytes.
    pub fn new(body: B, limit: usize) -> Self {
        ReceiveLimit { body, limit, header: [0; 5], header_read: 0, left: 0 }
    }

    /// Follows the messages' boundaries through `data`: the first message over the limit.
    fn over_limit(&mut self, mut data: &[u8]) -> Option<usize> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.left -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.header_read).min(data.len());
            self.header[self.header_read..self.header_read + n].copy_from_slice(&data[..n]);
            self.header_read += n;
            data = &data[n..];
            if self.header_read == 5 {
                self.header_read = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                if len > self.limit {
                    return Some(len);
                }
                self.left = len;
            }
        }
        None
    }
}

impl<B> Body for ReceiveLimit<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref() {
            if let Some(len) = self.over_limit(data.chunk()) {
                let limit = self.limit;
                let status = Status::resource_exhausted(format!(
                    "grpc: received message larger than max ({len} vs. {limit})"
                ));
                return Poll::Ready(Some(Err(Box::new(status))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::delivery::{EventRun, Picks};
    use cacher_core::{Event as CoreEvent, Object};
    use etcd_client::proto::PbResponseHeader;
    use etcd_client::proto::PbWatchResponse;

    #[test]
    fn the_receive_limit_follows_messages_across_frames() {
        let message = |len: usize| {
            let mut m = vec![0u8];
            m.extend_from_slice(&(len as u32).to_be_bytes());
            m.extend(std::iter::repeat_n(7u8, len));
            m
        };
        // Three messages of 10, 100 (the limit) and 101 bytes, in every split into 3-byte
        // frames: only the third's header is over the limit, found once it is whole.
        let stream = [message(10), message(100), message(101)].concat();
        let third = 5 + 10 + 5 + 100;
        for width in [1, 3, 5, 7, 200] {
            let mut limit = ReceiveLimit::new((), 100);
            let mut found = None;
            for (i, frame) in stream.chunks(width).enumerate() {
                if let Some(len) = limit.over_limit(frame) {
                    found = Some((i, len));
                    break;
                }
            }
            let frame_of_header_end = (third + 5 - 1) / width;
            assert_eq!(found, Some((frame_of_header_end, 101)), "frames of {width}");
        }
        let mut limit = ReceiveLimit::new((), 100);
        assert_eq!(limit.over_limit(&[message(0), message(100)].concat()), None);
    }

    #[tokio::test]
    async fn a_message_over_the_limit_ends_the_body_in_grpc_gos_words() {
        use http_body_util::BodyExt;
        let mut big = vec![0u8];
        big.extend_from_slice(&(5000u32).to_be_bytes());
        let body = http_body_util::Full::new(Bytes::from(big));
        let err = ReceiveLimit::new(body, 4096).collect().await.expect_err("over the limit");
        let status = err.downcast::<Status>().expect("a Status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.message(), "grpc: received message larger than max (5000 vs. 4096)");
    }

    #[test]
    fn framed_response_decodes_as_etcd_watch_response() {
        let o = Arc::new(Object::new(b"/a", Some(b"v2"), 7).with_etcd_meta(3, 2, 0));
        let prev = Arc::new(Object::new(b"/a", Some(b"v1"), 3).with_etcd_meta(3, 1, 0));
        let t = cacher_core::Timestamp::from_millis(0);
        let put = Arc::new(CoreEvent::put(o, Some(prev.clone()), t));
        let del = Arc::new(CoreEvent::delete(8, prev, t));
        let run = Arc::new(EventRun::new(9, vec![put, del]));
        let header = PbResponseHeader { cluster_id: 1, member_id: 2, revision: 9, raft_term: 3 };
        for (prev_kv, fragment) in [(false, false), (true, false), (true, true)] {
            let e = EventsResponse {
                watch_id: 5,
                header,
                run: run.clone(),
                picks: Picks::Range(0, 2),
                prev_kv,
                fragment,
                credit: None,
                size: 0,
            };
            let mut buf = BytesMut::new();
            encode_events(&e, &mut buf);
            let r = PbWatchResponse::decode(buf.freeze()).expect("decodes");
            // The same message the library builds without encoding.
            let typed = PbWatchResponse {
                header: Some(header),
                watch_id: 5,
                fragment,
                events: e
                    .picks
                    .iter()
                    .filter_map(|i| run.event(i))
                    .map(|ev| pb_event(ev, prev_kv))
                    .collect(),
                ..Default::default()
            };
            assert_eq!(r, typed);
            let kv = r.events[0].kv.clone().expect("kv");
            assert_eq!((kv.mod_revision, kv.create_revision, kv.version), (7, 3, 2));
            assert_eq!(r.events[0].prev_kv.is_some(), prev_kv);
            assert_eq!(r.events[1].r#type, crate::convert::EVENT_DELETE);
            assert_eq!(r.events[1].kv.as_ref().map(|k| k.mod_revision), Some(8));
        }
    }
}
