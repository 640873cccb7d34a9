//! etcd's `KV.Range` from the cache where etcd would give the same answer, and `KV.Compact`
//! passed through with the cache told about the new compaction revision. Every other KV call
//! (Put, DeleteRange, Txn) goes to etcd untouched (`forward.rs`).
//!
//! etcd counterparts: `server/etcdserver/api/v3rpc/key.go` (`checkRangeRequest`),
//! `server/etcdserver/txn/range.go` (count, more, limit, keys_only, count_only, header
//! revision = the store's current revision). Kubernetes counterpart: the consistent reads
//! from cache of `cacher.go`'s `GetList` (quorum read of the current revision, then wait
//! until the cache has it).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use etcd_client::proto::{
    PbCompactionRequest, PbCompactionResponse, PbRangeRequest, PbRangeResponse,
    PbRangeStreamResponse, PbResponseHeader,
};
use prost::Message;
use tonic::{Request, Response, Status};

use super::wire::ReceiveLimit;
use super::Ctx;
use crate::keys::etcd_key_range;
use crate::library::{range_from_cache, RangeQuery};
use crate::session::driver::is_refusal;
use crate::upstream::{forwardable, no_leader_status, requires_leader};

/// The axum route for `/etcdserverpb.KV/Range`: answered from the cache where etcd would give
/// the same answer, otherwise passed through as bytes ([`answer_or_relay`]).
pub(crate) async fn range_route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let (req, _, answer) = match answer_or_relay(&ctx, req, "range").await {
        Ok(x) => x,
        Err(relayed) => return relayed,
    };
    let mut answer = Some(answer.map(Response::new));
    let service = tower::service_fn(move |_| std::future::ready(once(&mut answer)));
    grpc_codec::<PbRangeResponse>(&ctx).unary(service, req).await
}

/// The axum route for `/etcdserverpb.KV/RangeStream` (etcd 3.7): as Range, the cache's answer
/// in etcd's chunks.
pub(crate) async fn range_stream_route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let (req, r, answer) = match answer_or_relay(&ctx, req, "range_stream").await {
        Ok(x) => x,
        Err(relayed) => return relayed,
    };
    let max = ctx.max_request_bytes;
    let mut answer = Some(answer.map(|resp| {
        let header = resp.header.unwrap_or_default();
        let chunks = range_chunks(resp, &r, header, max);
        let chunks: RangeChunks = Box::pin(futures::stream::iter(chunks.into_iter().map(Ok)));
        Response::new(chunks)
    }));
    let service = tower::service_fn(move |_| std::future::ready(once(&mut answer)));
    grpc_codec::<PbRangeStreamResponse>(&ctx).server_streaming(service, req).await
}

type RangeChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<PbRangeStreamResponse, Status>> + Send>>;

/// tonic's encoding of `T` answers to a Range request.
fn grpc_codec<T: Message + Default + Send + 'static>(
    ctx: &Ctx,
) -> tonic::server::Grpc<tonic_prost::ProstCodec<T, PbRangeRequest>> {
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
        .max_decoding_message_size(ctx.etcd_receive_limit())
        .max_encoding_message_size(usize::MAX)
}

/// The answer computed before tonic asked for it (tonic asks once per call).
fn once<T>(answer: &mut Option<Result<T, Status>>) -> Result<T, Status> {
    answer.take().unwrap_or_else(|| Err(Status::internal("a Range answered twice")))
}

/// Reads a Range or RangeStream call's one message and asks the cache: the call (to encode the
/// answer for), the request, and the cache's answer or refusal. Whatever the cache does not
/// answer, or the message that cannot be read here (compressed, cut short, too large, not a
/// RangeRequest), is passed through as it came, its bytes to etcd and etcd's answer's bytes
/// back (`Err`: that answer): nothing of either is decoded and encoded again (a large Range
/// outside the cached prefixes costs no copy of its answer here), fields this build does not
/// know reach etcd, and what etcd would refuse gets etcd's own refusal.
async fn answer_or_relay(
    ctx: &Arc<Ctx>,
    req: http::Request<axum::body::Body>,
    upstream_kind: &str,
) -> Result<
    (http::Request<axum::body::Body>, PbRangeRequest, Result<PbRangeResponse, Status>),
    http::Response<tonic::body::Body>,
> {
    let limit = ctx.etcd_receive_limit();
    let (parts, body) = req.into_parts();
    // A unary request's body is one length-prefixed message (5 bytes before it).
    let (decoded, body) = match read_up_to(body, limit.saturating_add(5)).await {
        Ok(Whole(bytes)) => {
            let decoded = grpc_message(&bytes, limit).and_then(|m| PbRangeRequest::decode(m).ok());
            (decoded, axum::body::Body::from(bytes))
        }
        // Longer than any message read here: etcd gets what was read and the rest.
        Ok(Partial(head, rest)) => {
            let head = futures::stream::once(std::future::ready(Ok(head)));
            (None, axum::body::Body::from_stream(head.chain(rest)))
        }
        // The client's side of the call failed: no one is there to read an answer.
        Err(e) => return Err(Status::cancelled(format!("reading the request: {e}")).into_http()),
    };
    let req = http::Request::from_parts(parts, body);
    let answer = match decoded {
        Some(r) => {
            let md =
                forwardable(&tonic::metadata::MetadataMap::from_headers(req.headers().clone()));
            from_cache(ctx, &md, &r).await.transpose().map(|a| (r, a))
        }
        None => None,
    };
    let Some((r, answer)) = answer else {
        ctx.metrics().count_range(false);
        ctx.metrics().count_upstream_request(upstream_kind);
        return Err(super::forward::relay(ctx, req).await);
    };
    if answer.is_ok() {
        ctx.metrics().count_range(true);
    }
    Ok((req, r, answer))
}

/// A request body read up to a limit.
enum ReadUpTo {
    /// The whole body, at most the limit.
    Whole(Bytes),
    /// More than the limit: what was read (the limit and at most one frame more), and the rest.
    Partial(Bytes, axum::body::BodyDataStream),
}
use ReadUpTo::{Partial, Whole};

/// Reads `body` until its end or until more than `limit` bytes were read. Trailers, which gRPC
/// clients do not send with requests, are not kept (etcd's gRPC server does not read them).
async fn read_up_to(body: axum::body::Body, limit: usize) -> Result<ReadUpTo, axum::Error> {
    let mut data = body.into_data_stream();
    let mut read = BytesMut::new();
    while let Some(chunk) = data.next().await {
        read.extend_from_slice(&chunk?);
        if read.len() > limit {
            return Ok(Partial(read.freeze(), data));
        }
    }
    Ok(Whole(read.freeze()))
}

/// The message of a unary call's body, if it is one uncompressed message of at most `limit`
/// bytes, whole.
fn grpc_message(body: &[u8], limit: usize) -> Option<&[u8]> {
    let (&compressed, rest) = body.split_first()?;
    let (len, message) = rest.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    (compressed == 0 && len == message.len() && len <= limit).then_some(message)
}

/// A whole Range answer in RangeStream's chunks, as etcd cuts them
/// (`etcdserver/v3_server.go` `rangeStream`): 10 keys first, then twice or half as many as
/// the previous chunk when its size was under half or over twice the target; `header`, `more`
/// and `count` only on the last chunk; count-only requests in one message.
fn range_chunks(
    full: PbRangeResponse,
    r: &PbRangeRequest,
    header: PbResponseHeader,
    target: usize,
) -> Vec<PbRangeStreamResponse> {
    let rev_only = PbResponseHeader { revision: header.revision, ..Default::default() };
    let msg = |range_response| PbRangeStreamResponse { range_response: Some(range_response) };
    if r.count_only {
        return vec![msg(PbRangeResponse {
            header: Some(header),
            count: full.count,
            ..Default::default()
        })];
    }
    let total_limit = if r.limit > 0 { r.limit as usize } else { usize::MAX };
    let kvs = full.kvs;
    let count = full.count.max(0) as usize;
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut limit = 10usize.min(total_limit);
    loop {
        let end = (start + limit).min(kvs.len());
        let chunk: Vec<_> = kvs[start..end].to_vec();
        // What etcd's txn.Range answers for this chunk: its size picks the next limit. Its
        // count is what that Range read: the keys up to its limit + 1 (`rangeLimit`), as
        // `treeIndex.Range` without the total stops there, not every key left.
        let more = end < count;
        let as_range = PbRangeResponse {
            header: Some(rev_only),
            kvs: chunk,
            more,
            count: (count - start).min(limit.saturating_add(1)) as i64,
        };
        let size = prost::Message::encoded_len(&as_range);
        let done = !more || end >= total_limit;
        let PbRangeResponse { kvs: chunk, .. } = as_range;
        if done {
            out.push(msg(PbRangeResponse {
                header: Some(header),
                kvs: chunk,
                more,
                count: count as i64,
            }));
            return out;
        }
        out.push(msg(PbRangeResponse { kvs: chunk, ..Default::default() }));
        start = end;
        if size < target / 2 {
            limit *= 2;
        } else if size > target * 2 {
            limit /= 2;
        }
        limit = limit.max(1).min(total_limit - start);
    }
}

/// The axum route for `/etcdserverpb.KV/Compact`.
pub(crate) async fn compact_route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
        PbCompactionResponse,
        PbCompactionRequest,
    >::default())
    .max_decoding_message_size(ctx.etcd_receive_limit());
    let req = req.map(|body| ReceiveLimit::new(body, ctx.etcd_receive_limit()));
    grpc.unary(tower::service_fn(move |r| compact(ctx.clone(), r)), req).await
}

/// Compact passes through to etcd; the caches note the compaction (a read at an older revision
/// must then go to etcd, as it would be refused there).
async fn compact(
    ctx: Arc<Ctx>,
    req: Request<PbCompactionRequest>,
) -> Result<Response<PbCompactionResponse>, Status> {
    let md = forwardable(req.metadata());
    let r = req.into_inner();
    let rev = r.revision;
    ctx.metrics().count_upstream_request("compact");
    let resp = ctx
        .upstream()
        .unary::<PbCompactionRequest, PbCompactionResponse>("/etcdserverpb.KV/Compact", &md, r)
        .await?;
    if rev > 0 {
        ctx.note_compacted(rev as u64);
    }
    Ok(resp)
}

/// When the cache may answer a Range exactly as etcd would: a valid request over keys of one
/// range, in key order, without revision filters.
fn cacheable(r: &PbRangeRequest) -> Option<RangeQuery> {
    const SORT_NONE: i32 = 0;
    const SORT_ASCEND: i32 = 1;
    const TARGET_KEY: i32 = 0;
    if r.key.is_empty()
        || r.revision < 0
        || r.limit < 0
        || r.sort_target != TARGET_KEY
        || !(r.sort_order == SORT_NONE || r.sort_order == SORT_ASCEND)
        || r.min_mod_revision != 0
        || r.max_mod_revision != 0
        || r.min_create_revision != 0
        || r.max_create_revision != 0
    {
        return None;
    }
    Some(RangeQuery {
        range: etcd_key_range(&r.key, &r.range_end).ok()?,
        revision: r.revision as u64,
        serializable: r.serializable,
        limit: r.limit as u64,
        keys_only: r.keys_only,
        count_only: r.count_only,
    })
}

async fn from_cache(
    ctx: &Ctx,
    md: &tonic::metadata::MetadataMap,
    r: &PbRangeRequest,
) -> Result<Option<PbRangeResponse>, Status> {
    let Some(q) = cacheable(r) else { return Ok(None) };
    let Some(c) = ctx.cache_for(&q.range) else { return Ok(None) };
    let cache = &ctx.caches()[c];
    if !cache.status().ready {
        return Ok(None);
    }
    // etcd refuses a require-leader call while its member has no leader (a read passed
    // through gets that answer from etcd itself).
    if requires_leader(md) && ctx.upstream().no_leader() {
        return Err(no_leader_status());
    }
    if let Err(s) = ctx.auth.check(md, &r.key, &r.range_end).await {
        if is_refusal(&s) {
            return Err(s);
        }
        return Ok(None);
    }
    Ok(range_from_cache(cache, ctx.upstream(), &q).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unary_body_is_read_only_when_whole_uncompressed_and_within_the_limit() {
        let msg = PbRangeRequest { key: b"/a".to_vec(), ..Default::default() }.encode_to_vec();
        let frame = |compressed: u8, len: usize, body: &[u8]| {
            let mut f = vec![compressed];
            f.extend_from_slice(&(len as u32).to_be_bytes());
            f.extend_from_slice(body);
            f
        };
        let whole = frame(0, msg.len(), &msg);
        assert_eq!(grpc_message(&whole, 100), Some(&msg[..]));
        assert_eq!(grpc_message(&frame(1, msg.len(), &msg), 100), None, "compressed");
        assert_eq!(grpc_message(&frame(0, msg.len() + 1, &msg), 100), None, "cut short");
        assert_eq!(grpc_message(&frame(0, msg.len() - 1, &msg), 100), None, "more than one");
        assert_eq!(grpc_message(&whole, msg.len() - 1), None, "over the limit");
        assert_eq!(grpc_message(&whole[..3], 100), None, "no length");
        assert_eq!(grpc_message(&[], 100), None, "empty");
        assert_eq!(grpc_message(&frame(0, 0, &[]), 100), Some(&[][..]), "an empty message");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_handed_on_with_every_byte_in_order() {
        let body = || {
            let chunks = (0u8..10).map(|i| Ok::<_, std::io::Error>(Bytes::from(vec![i; 100])));
            axum::body::Body::from_stream(futures::stream::iter(chunks))
        };
        let all: Vec<u8> = (0u8..10).flat_map(|i| vec![i; 100]).collect();
        match read_up_to(body(), 1000).await.expect("read") {
            Whole(b) => assert_eq!(&b[..], &all[..]),
            Partial(..) => panic!("1 000 bytes are within a limit of 1 000"),
        }
        match read_up_to(body(), 250).await.expect("read") {
            Whole(_) => panic!("1 000 bytes are over a limit of 250"),
            Partial(head, rest) => {
                assert_eq!(head.len(), 300, "read up to the frame that crossed the limit");
                let rest: Vec<Bytes> = rest.map(|c| c.expect("rest")).collect().await;
                assert_eq!([&head[..], &rest.concat()[..]].concat(), all);
            }
        }
        let failing = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(std::io::Error::other("reset")),
        ]);
        let r = read_up_to(axum::body::Body::from_stream(failing), 1000).await;
        assert!(r.is_err(), "a failed body is an error, not a short message");
    }

    #[test]
    fn only_plain_ranges_are_cacheable() {
        let base =
            PbRangeRequest { key: b"/a".to_vec(), range_end: b"/b".to_vec(), ..Default::default() };
        assert!(cacheable(&base).is_some());
        assert!(cacheable(&PbRangeRequest { sort_order: 2, ..base.clone() }).is_none());
        assert!(cacheable(&PbRangeRequest { sort_target: 1, ..base.clone() }).is_none());
        assert!(cacheable(&PbRangeRequest { min_mod_revision: 3, ..base.clone() }).is_none());
        assert!(cacheable(&PbRangeRequest { revision: -1, ..base.clone() }).is_none());
        assert!(cacheable(&PbRangeRequest { key: vec![], ..base.clone() }).is_none());
        assert!(cacheable(&PbRangeRequest { range_end: b"/".to_vec(), ..base }).is_none());
    }
}
