//! etcd's wire format at the server's edge: a cached event is encoded once per option set
//! (`convert::encode_event_field`, inside its shared run, `cache/delivery.rs`), and each
//! watcher's response is framed from those bytes: its own header and watch id, then the shared
//! events. The Watch stream's request decoder.
//!
//! etcd counterparts: `api/etcdserverpb/rpc.proto` (`WatchResponse`); the framing replaces
//! what `server/etcdserver/api/v3rpc/watch.go`'s `sendLoop` builds per watcher.

use bytes::{BufMut, BytesMut};
use etcd_client::proto::PbWatchRequest;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::delivery::{EventRun, Picks};
    use cacher_core::{Event as CoreEvent, Object};
    use etcd_client::proto::PbResponseHeader;
    use etcd_client::proto::PbWatchResponse;

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
