//! The core's objects and events as etcd's messages (typed, no bytes): `mvccpb.KeyValue`,
//! `mvccpb.Event`, and the `RangeResponse` of a read the cache served. The library hands these
//! to its callers; the server's wire layer (`server/wire.rs`) encodes the same messages once per
//! revision and option set.
//!
//! etcd counterparts: `api/mvccpb/kv.proto`, `api/etcdserverpb/rpc.proto` (`RangeResponse`),
//! `server/etcdserver/txn/range.go` (what `keys_only` and `count_only` leave out).

use cacher_core::{Event, Object, RangeRead};
use etcd_client::proto::{PbEvent, PbKeyValue, PbRangeResponse, PbResponseHeader};

/// etcd's `mvccpb.Event.EventType`.
pub const EVENT_PUT: i32 = 0;
/// etcd's `mvccpb.Event.EventType`.
pub const EVENT_DELETE: i32 = 1;
/// `WatchCreateRequest.FilterType.NOPUT`.
pub const FILTER_NOPUT: i32 = 0;
/// `WatchCreateRequest.FilterType.NODELETE`.
pub const FILTER_NODELETE: i32 = 1;

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

/// The field number of `WatchResponse.events`.
const EVENTS_FIELD: u32 = 11;

/// One event encoded as the `events` field of a `WatchResponse` (tag, length, message): the
/// bytes every watcher with the same `prev_kv` option receives, appended to its own header.
pub fn encode_event_field(ev: &Event, prev_kv: bool) -> bytes::Bytes {
    let pb = pb_event(ev, prev_kv);
    let mut buf = bytes::BytesMut::with_capacity(prost::Message::encoded_len(&pb) + 8);
    prost::encoding::message::encode(EVENTS_FIELD, &pb, &mut buf);
    buf.freeze()
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
