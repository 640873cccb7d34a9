//! Everything the cache does not answer goes to etcd unchanged: the client's HTTP/2 gRPC call
//! (unary or streaming, with its metadata: token, deadlines) is sent on the shared channel to
//! etcd and etcd's answer streamed back. Writes, Txn, leases (keep-alive streams included),
//! auth, cluster, maintenance, lock and election all take this path.
//!
//! etcd counterpart: what the gRPC proxy does per service in `server/proxy/grpcproxy/`
//! (kv.go, lease.go, auth.go, cluster.go, maintenance.go), done once, generically.

use std::sync::Arc;

use tower::{Service, ServiceExt};
use tracing::debug;

use super::Ctx;

/// The fallback route: forwards any call to etcd.
pub(crate) async fn forward(
    ctx: Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    ctx.metrics().count_upstream_request(&format!("forward:{}", req.uri().path()));
    relay(&ctx, req).await
}

/// Sends a call to etcd as it came, and returns etcd's answer as it comes.
pub(crate) async fn relay(
    ctx: &Arc<Ctx>,
    req: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let path = req.uri().path().to_owned();
    let (parts, body) = req.into_parts();
    let mut builder =
        http::Request::builder().method(parts.method.clone()).version(http::Version::HTTP_2);
    let uri = http::Uri::builder()
        .path_and_query(parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .build();
    let Ok(uri) = uri else {
        return tonic::Status::invalid_argument("bad request path").into_http();
    };
    builder = builder.uri(uri);
    for (k, v) in parts.headers.iter() {
        if k == http::header::HOST || k == http::header::CONNECTION {
            continue;
        }
        builder = builder.header(k, v);
    }
    let Ok(upstream_req) = builder.body(tonic::body::Body::new(body)) else {
        return tonic::Status::invalid_argument("bad request").into_http();
    };
    let Some(mut channel) = ctx.upstream().channel() else {
        return tonic::Status::unimplemented("no raw channel to etcd").into_http();
    };
    let resp = match channel.ready().await {
        Ok(ch) => ch.call(upstream_req).await,
        Err(e) => Err(e),
    };
    match resp {
        Ok(r) => {
            if r.status() == http::StatusCode::OK {
                after_success(ctx, &path);
            }
            r
        }
        Err(e) => {
            debug!(%path, error = %e, "forwarding to etcd failed");
            tonic::Status::unavailable(format!("etcdserver: unable to reach etcd: {e}")).into_http()
        }
    }
}

/// Keeps the cache's view of auth current when auth changes pass through it: enabling or
/// disabling auth, users, roles and grants drop the cached decisions and re-read etcd's state.
fn after_success(ctx: &Arc<Ctx>, path: &str) {
    let Some(method) = path.strip_prefix("/etcdserverpb.Auth/") else { return };
    if matches!(
        method,
        "Authenticate" | "AuthStatus" | "UserGet" | "UserList" | "RoleGet" | "RoleList"
    ) {
        return;
    }
    // At once, before the client hears etcd's answer: a read right after an AuthEnable
    // through the cache is checked (it was served unchecked until etcd's state was read
    // again). gRPC answers are 200 even on error: the state is read again either way.
    crate::server::auth::auth_call_answered(&ctx.auth);
}
