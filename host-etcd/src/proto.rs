//! etcd's wire format at the cache's edge: core events as `mvccpb.Event`s, encoded once per
//! revision and option set and framed per watcher; the Watch stream's codec.
//!
//! etcd counterparts: `api/mvccpb/kv.proto`, `api/etcdserverpb/rpc.proto` (`WatchResponse`);
//! the framing replaces what `server/etcdserver/api/v3rpc/watch.go`'s `sendLoop` builds per
//! watcher.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use cacher_core::{Event, Object, RangeRead};
use etcd_client::proto::{
    PbEvent, PbKeyValue, PbRangeResponse, PbResponseHeader, PbWatchRequest, PbWatchResponse,
};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// etcd's `mvccpb.Event.EventType`.
pub const EVENT_PUT: i32 = 0;
/// etcd's `mvccpb.Event.EventType`.
pub const EVENT_DELETE: i32 = 1;
/// `WatchCreateRequest.FilterType.NOPUT`.
pub const FILTER_NOPUT: i32 = 0;
/// `WatchCreateRequest.FilterType.NODELETE`.
pub const FILTER_NODELETE: i32 = 1;
/// The field number of `WatchResponse.events`.
const EVENTS_FIELD: u32 = 11;

/// A stored object as etcd's `KeyValue`.
pub fn key_value(o: &Object) -> PbKeyValue {
    PbKeyValue {
        key: o.key().to_vec(),
        create_revision: o.create_rv() as i64,
        mod_revision: o.rv() as i64,
        version: o.version(),
        value: o.value().unwrap_or_default().to_vec(),
        lease: o.lease(),
    }
}

/// etcd's Range answer for a read the cache served: `keys_only` drops the value and the lease
/// (as etcd does), `count_only` the items and `more`.
pub fn range_response(
    read: &RangeRead,
    header: PbResponseHeader,
    keys_only: bool,
    count_only: bool,
) -> PbRangeResponse {
    let kvs = if count_only {
        Vec::new()
    } else {
        read.items
            .iter()
            .map(|o| {
                let mut kv = key_value(o);
                if keys_only {
                    kv.value.clear();
                    kv.lease = 0;
                }
                kv
            })
            .collect()
    };
    PbRangeResponse {
        header: Some(header),
        kvs,
        more: read.more && !count_only,
        count: read.count as i64,
    }
}

/// A core event as etcd's `Event`: a put carries the new value; a delete carries the key at the
/// deletion's revision (as etcd sends it); `prev_kv` carries the previous value when asked for.
pub fn pb_event(ev: &Event, prev_kv: bool) -> PbEvent {
    let (r#type, kv) = match ev.object() {
        Some(o) if !ev.is_delete() => (EVENT_PUT, key_value(o)),
        _ => (
            EVENT_DELETE,
            PbKeyValue {
                key: ev.key().to_vec(),
                mod_revision: ev.rv() as i64,
                ..Default::default()
            },
        ),
    };
    let prev = if prev_kv { ev.prev().map(|p| key_value(p)) } else { None };
    PbEvent { r#type, kv: Some(kv), prev_kv: prev }
}

/// One event encoded as the `events` field of a `WatchResponse` (tag, length, message): the
/// bytes every watcher with the same `prev_kv` option receives, appended to its own header.
pub fn encode_event_field(ev: &Event, prev_kv: bool) -> Bytes {
    let pb = pb_event(ev, prev_kv);
    let mut buf = BytesMut::with_capacity(pb.encoded_len() + 8);
    prost::encoding::message::encode(EVENTS_FIELD, &pb, &mut buf);
    buf.freeze()
}

/// An encoded event and its revision.
#[derive(Clone, Debug)]
pub struct EncodedEvent {
    /// `mod_revision` of the event (the deletion's revision for a delete).
    pub rev: u64,
    /// The `events` field bytes.
    pub bytes: Bytes,
}

/// What the Watch stream sends: a typed response, or one framed from pre-encoded events.
#[derive(Debug)]
pub enum WatchOut {
    /// A typed response (created, canceled, progress, relayed from etcd).
    Msg(Box<PbWatchResponse>),
    /// Events for one watcher: its header and id, then the shared event bytes.
    Frame {
        /// The response header.
        header: PbResponseHeader,
        /// The client's watch id.
        watch_id: i64,
        /// The events, whole revisions.
        events: Arc<[EncodedEvent]>,
        /// The slice of `events` this response carries.
        range: std::ops::Range<usize>,
    },
}

impl WatchOut {
    /// Wraps a typed response.
    pub fn msg(r: PbWatchResponse) -> WatchOut {
        WatchOut::Msg(Box::new(r))
    }

    /// The encoded length.
    pub fn encoded_len(&self) -> usize {
        match self {
            WatchOut::Msg(m) => m.encoded_len(),
            WatchOut::Frame { header, watch_id, events, range } => {
                prost::encoding::message::encoded_len(1, header)
                    + if *watch_id != 0 {
                        prost::encoding::int64::encoded_len(2, watch_id)
                    } else {
                        0
                    }
                    + events[range.clone()].iter().map(|e| e.bytes.len()).sum::<usize>()
            }
        }
    }
}

/// The Watch service's codec: decodes `WatchRequest`s with prost, encodes [`WatchOut`].
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchCodec;

/// Encoder half of [`WatchCodec`].
#[derive(Debug)]
pub struct WatchEncoder;

/// Decoder half of [`WatchCodec`].
#[derive(Debug)]
pub struct WatchDecoder;

impl Codec for WatchCodec {
    type Encode = WatchOut;
    type Decode = PbWatchRequest;
    type Encoder = WatchEncoder;
    type Decoder = WatchDecoder;

    fn encoder(&mut self) -> WatchEncoder {
        WatchEncoder
    }

    fn decoder(&mut self) -> WatchDecoder {
        WatchDecoder
    }
}

impl Encoder for WatchEncoder {
    type Item = WatchOut;
    type Error = Status;

    fn encode(&mut self, item: WatchOut, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            WatchOut::Msg(m) => {
                m.encode(dst).map_err(|e| Status::internal(format!("encoding: {e}")))
            }
            WatchOut::Frame { header, watch_id, events, range } => {
                prost::encoding::message::encode(1, &header, dst);
                if watch_id != 0 {
                    prost::encoding::int64::encode(2, &watch_id, dst);
                }
                for e in &events[range] {
                    dst.put_slice(&e.bytes);
                }
                Ok(())
            }
        }
    }
}

impl Decoder for WatchDecoder {
    type Item = PbWatchRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<PbWatchRequest>, Status> {
        PbWatchRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("grpc: error unmarshalling request: {e}")))
    }
}

/// A [`WatchOut`] as the client decodes it (for in-process clients of the session).
pub fn decode_watch_out(out: WatchOut) -> Result<PbWatchResponse, prost::DecodeError> {
    match out {
        WatchOut::Msg(m) => Ok(*m),
        WatchOut::Frame { header, watch_id, events, range } => {
            let mut buf = BytesMut::new();
            prost::encoding::message::encode(1, &header, &mut buf);
            if watch_id != 0 {
                prost::encoding::int64::encode(2, &watch_id, &mut buf);
            }
            for e in &events[range] {
                buf.put_slice(&e.bytes);
            }
            PbWatchResponse::decode(buf.freeze())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cacher_core::Event as CoreEvent;

    #[test]
    fn framed_response_decodes_as_etcd_watch_response() {
        let o = Arc::new(Object::new(b"/a", Some(b"v2"), 7).with_etcd_meta(3, 2, 0));
        let prev = Arc::new(Object::new(b"/a", Some(b"v1"), 3).with_etcd_meta(3, 1, 0));
        let put = CoreEvent::put(o, Some(prev.clone()), cacher_core::Timestamp::from_millis(0));
        let del = CoreEvent::delete(8, prev, cacher_core::Timestamp::from_millis(0));
        let events: Arc<[EncodedEvent]> = Arc::from(vec![
            EncodedEvent { rev: 7, bytes: encode_event_field(&put, true) },
            EncodedEvent { rev: 8, bytes: encode_event_field(&del, false) },
        ]);
        let header = PbResponseHeader { cluster_id: 1, member_id: 2, revision: 9, raft_term: 3 };
        let out = WatchOut::Frame { header, watch_id: 5, events, range: 0..2 };
        let len = out.encoded_len();
        let mut buf = BytesMut::new();
        match out {
            WatchOut::Frame { header, watch_id, events, range } => {
                prost::encoding::message::encode(1, &header, &mut buf);
                prost::encoding::int64::encode(2, &watch_id, &mut buf);
                for e in &events[range] {
                    buf.put_slice(&e.bytes);
                }
            }
            WatchOut::Msg(_) => unreachable!(),
        }
        assert_eq!(buf.len(), len);
        let r = PbWatchResponse::decode(buf.freeze()).expect("decodes");
        assert_eq!(r.watch_id, 5);
        assert_eq!(r.header.map(|h| h.revision), Some(9));
        assert_eq!(r.events.len(), 2);
        let kv = r.events[0].kv.clone().expect("kv");
        assert_eq!((kv.mod_revision, kv.create_revision, kv.version), (7, 3, 2));
        assert_eq!(r.events[0].prev_kv.as_ref().map(|p| p.value.clone()), Some(b"v1".to_vec()));
        assert_eq!(r.events[1].r#type, EVENT_DELETE);
        assert_eq!(r.events[1].kv.as_ref().map(|k| k.mod_revision), Some(8));
        assert!(r.events[1].prev_kv.is_none());
    }
}
