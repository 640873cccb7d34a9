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

use etcd_client::proto::{
    PbCompactionRequest, PbCompactionResponse, PbRangeRequest, PbRangeResponse,
};
use tonic::{Request, Response, Status};

use super::Ctx;
use crate::keys::etcd_key_range;
use crate::library::{range_from_cache, RangeQuery};
use crate::session::driver::is_refusal;
use crate::upstream::forwardable;

/// The axum route for `/etcdserverpb.KV/Range`.
pub(crate) async fn range_route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
        PbRangeResponse,
        PbRangeRequest,
    >::default())
    .max_decoding_message_size(ctx.max_request_bytes)
    .max_encoding_message_size(usize::MAX);
    grpc.unary(tower::service_fn(move |r| range(ctx.clone(), r)), req).await
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
    .max_decoding_message_size(ctx.max_request_bytes);
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

async fn range(
    ctx: Arc<Ctx>,
    req: Request<PbRangeRequest>,
) -> Result<Response<PbRangeResponse>, Status> {
    let md = forwardable(req.metadata());
    let r = req.into_inner();
    if let Some(resp) = from_cache(&ctx, &md, &r).await? {
        ctx.metrics().count_range(true);
        return Ok(Response::new(resp));
    }
    ctx.metrics().count_range(false);
    ctx.metrics().count_upstream_request("range");
    ctx.upstream().unary::<PbRangeRequest, PbRangeResponse>("/etcdserverpb.KV/Range", &md, r).await
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
