//! etcd's `Watch` service on the wire: each client stream gets a watch session (`session/`),
//! its requests decoded with prost, its responses encoded by [`wire::WatchCodec`] (cached
//! events from their shared encodings).
//!
//! etcd counterpart: `server/etcdserver/api/v3rpc/watch.go` (`Watch`, the stream's setup).

use std::sync::Arc;

use etcd_client::proto::PbWatchRequest;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::wire::WatchCodec;
use super::Ctx;
use crate::session::driver::{self, OutItem, Outbox};
use crate::session::Response;
use crate::upstream::forwardable;

/// The axum route for `/etcdserverpb.Watch/Watch`.
pub(crate) async fn route(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let mut grpc =
        tonic::server::Grpc::new(WatchCodec).max_decoding_message_size(ctx.max_request_bytes);
    grpc.streaming(tower::service_fn(move |r| watch(ctx.clone(), r)), req).await
}

type OutStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<Response, Status>> + Send>>;

/// One client Watch stream: a session serves it until it ends.
async fn watch(
    ctx: Arc<Ctx>,
    req: tonic::Request<Streaming<PbWatchRequest>>,
) -> Result<tonic::Response<OutStream>, Status> {
    let md = forwardable(req.metadata());
    let inbound = req.into_inner();
    let (out, rx) = Outbox::new();
    tokio::spawn(driver::run(ctx.env.clone(), md, inbound, out));
    Ok(tonic::Response::new(out_stream(rx)))
}

/// The items as a stream for the transport (each permit is released as the item is taken).
fn out_stream(rx: tokio::sync::mpsc::Receiver<OutItem>) -> OutStream {
    Box::pin(futures::StreamExt::map(ReceiverStream::new(rx), |(item, _permit)| item))
}
