//! etcd auth at the cache's edge: a client reads from the cache only what etcd would let it
//! read. The decision is etcd's own (a count-only `Range` of the same keys with the client's
//! token), cached per token and range for a bounded time.
//!
//! etcd counterparts: `server/auth/store.go` (`IsRangePermitted`), and the watch server's
//! `isWatchPermitted` in `v3rpc/watch.go`, which checks a watch's range once, at creation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::proto::{PbRangeRequest, PbRangeResponse, PbResponseHeader};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::metrics::HostMetrics;
use crate::session::driver::{go_status_string, is_refusal, Permissions};
use crate::session::Permission;
use crate::upstream::Upstream;

/// `etcdserverpb.AuthStatusRequest` (not exported by etcd-client).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthStatusRequest {}

/// `etcdserverpb.AuthStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthStatusResponse {
    /// Header.
    #[prost(message, optional, tag = "1")]
    pub header: Option<PbResponseHeader>,
    /// Whether auth is enabled.
    #[prost(bool, tag = "2")]
    pub enabled: bool,
    /// The auth store's revision.
    #[prost(uint64, tag = "3")]
    pub auth_revision: u64,
}

/// etcd's answer, and when it was given.
struct Decision {
    at: Instant,
    result: Result<(), Status>,
}
/// (token, key, range_end).
/// Whose decision about which keys.
#[derive(PartialEq, Eq, Hash)]
struct DecisionKey {
    /// Whose decision: the token as etcd finds it, `None` for a client without one.
    token: Option<Vec<u8>>,
    key: Vec<u8>,
    range_end: Vec<u8>,
}

/// The token etcd takes a client's identity from (`auth/store.go` `AuthInfoFromCtx`): the
/// `token` metadata, or else `authorization` (grpc-gateway's), without a leading `Bearer `.
fn client_token(md: &MetadataMap) -> Option<Vec<u8>> {
    let v = md.get("token").or_else(|| md.get("authorization"))?.as_bytes();
    Some(v.strip_prefix(b"Bearer ").unwrap_or(v).to_vec())
}

/// Permission checks for cached reads.
pub struct AuthChecker {
    upstream: Upstream,
    enabled: AtomicBool,
    /// Bumped by every change of auth seen or made through the cache: an answer of etcd's
    /// asked for before it (a decision, an auth state saying "off") is not kept.
    changes: AtomicU64,
    ttl: Duration,
    decisions: Mutex<HashMap<DecisionKey, Decision>>,
    metrics: Arc<HostMetrics>,
}

impl AuthChecker {
    /// A checker; `enabled` is refreshed from etcd with [`AuthChecker::refresh`]. Until etcd
    /// says auth is off, it counts as on: every read is checked with etcd (whose answer is
    /// right either way), never served unchecked because etcd could not be asked yet.
    pub fn new(upstream: Upstream, ttl: Duration, metrics: Arc<HostMetrics>) -> AuthChecker {
        AuthChecker {
            upstream,
            enabled: AtomicBool::new(true),
            changes: AtomicU64::new(0),
            ttl,
            decisions: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Whether etcd has auth enabled (as of the last refresh).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Asks etcd whether auth is enabled. A change drops every cached decision. An answer
    /// that auth is off is dropped if auth changed through the cache while it was asked.
    pub async fn refresh(&self) {
        let asked_at = self.changes.load(Ordering::SeqCst);
        let md = MetadataMap::new();
        match self
            .upstream
            .unary::<AuthStatusRequest, AuthStatusResponse>(
                "/etcdserverpb.Auth/AuthStatus",
                &md,
                AuthStatusRequest {},
            )
            .await
        {
            Ok(r) => {
                let on = r.into_inner().enabled;
                if on || self.changes.load(Ordering::SeqCst) == asked_at {
                    self.set_enabled(on)
                }
            }
            // AuthStatus itself needs a user when auth is on, in some etcd versions.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unauthenticated
                        | tonic::Code::PermissionDenied
                        | tonic::Code::InvalidArgument
                ) =>
            {
                self.set_enabled(true)
            }
            Err(_) => {}
        }
    }

    /// Sets the auth state.
    pub fn set_enabled(&self, on: bool) {
        if self.enabled.swap(on, Ordering::Relaxed) != on {
            self.invalidate();
        }
    }

    /// Forgets every cached decision (after a change of users, roles or permissions made
    /// through the cache), and any decision still being asked for.
    pub fn invalidate(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut d) = self.decisions.lock() {
            d.clear();
        }
    }

    /// An auth call passed through the cache (auth turned on or off, users, roles, grants):
    /// until etcd's state is read again, auth counts as on and every decision is asked anew,
    /// which is right whatever the call did.
    pub fn note_auth_change(&self) {
        self.enabled.store(true, Ordering::SeqCst);
        self.invalidate();
    }

    /// Whether the client with this metadata may read `[key, range_end)` (etcd's range
    /// conventions). `Ok` when auth is off.
    pub async fn check(
        &self,
        md: &MetadataMap,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Status> {
        if !self.enabled() {
            return Ok(());
        }
        let k = DecisionKey {
            token: client_token(md),
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        };
        let now = Instant::now();
        if let Ok(d) = self.decisions.lock() {
            if let Some(decision) = d.get(&k) {
                if now.duration_since(decision.at) < self.ttl {
                    self.metrics.count_auth_check(true);
                    return decision.result.clone();
                }
            }
        }
        self.metrics.count_auth_check(false);
        self.metrics.count_upstream_request("auth_check");
        let asked_at = self.changes.load(Ordering::SeqCst);
        let req = PbRangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit: 1,
            serializable: true,
            count_only: true,
            ..Default::default()
        };
        let r = self
            .upstream
            .unary::<PbRangeRequest, PbRangeResponse>("/etcdserverpb.KV/Range", md, req)
            .await
            .map(|_| ());
        let decided = match &r {
            Ok(()) => true,
            Err(s) => crate::session::driver::is_refusal(s),
        };
        if decided {
            if let Ok(mut d) = self.decisions.lock() {
                if self.changes.load(Ordering::SeqCst) != asked_at {
                    // Auth changed while etcd was asked: the answer is this call's alone.
                    return r;
                }
                if d.len() > 100_000 {
                    d.retain(|_, decision| now.duration_since(decision.at) < self.ttl);
                }
                d.insert(k, Decision { at: now, result: r.clone() });
            }
        }
        r
    }
}

/// An auth call (auth turned on or off, users, roles, grants) passed through the cache and
/// etcd answered it: auth counts as on at once, every decision is dropped, and etcd's state
/// is read again shortly (20 ms: etcd has applied it by then).
pub(crate) fn auth_call_answered(auth: &Arc<AuthChecker>) {
    auth.note_auth_change();
    let auth = auth.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        auth.refresh().await;
        auth.invalidate();
    });
}

/// Whether HTTP request bytes name a call of etcd's auth service (the gateway's
/// `/v3/auth/...`, `/v3beta/auth/...`): a request line, or any bytes that look like one, which
/// only costs checks that were not needed.
pub(crate) fn names_auth_call(bytes: &[u8]) -> bool {
    bytes.windows(AUTH_PATH.len()).any(|w| w == AUTH_PATH)
}

/// The part of an auth call's path that [`names_auth_call`] looks for.
pub(crate) const AUTH_PATH: &[u8] = b"/auth/";

/// The watch sessions ask the checker before serving a cached watch.
pub(crate) struct AuthPermissions(pub std::sync::Arc<AuthChecker>);

impl Permissions for AuthPermissions {
    fn check(
        &self,
        md: MetadataMap,
        key: Vec<u8>,
        range_end: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Permission> + Send>> {
        let auth = self.0.clone();
        Box::pin(async move {
            match auth.check(&md, &key, &range_end).await {
                Ok(()) => Permission::Allowed,
                Err(s) if is_refusal(&s) => Permission::Denied(go_status_string(&s)),
                // etcd unreachable: let etcd's own watch say what happens.
                Err(_) => Permission::Unknown,
            }
        })
    }

    fn check_now(&self) -> Option<Permission> {
        (!self.0.enabled()).then_some(Permission::Allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_where_etcd_finds_it() {
        let md = |pairs: &[(&'static str, &str)]| {
            let mut m = MetadataMap::new();
            for (k, v) in pairs {
                m.append(*k, v.parse().expect("value"));
            }
            m
        };
        assert_eq!(client_token(&md(&[])), None);
        assert_eq!(client_token(&md(&[("token", "t1")])), Some(b"t1".to_vec()));
        assert_eq!(client_token(&md(&[("authorization", "Bearer t2")])), Some(b"t2".to_vec()));
        assert_eq!(client_token(&md(&[("authorization", "t2")])), Some(b"t2".to_vec()));
        // `token` wins, present even when empty; the first value counts.
        let both = md(&[("authorization", "Bearer t2"), ("token", "t1")]);
        assert_eq!(client_token(&both), Some(b"t1".to_vec()));
        assert_eq!(client_token(&md(&[("token", ""), ("authorization", "t2")])), Some(vec![]));
        assert_eq!(client_token(&md(&[("token", "t1"), ("token", "t3")])), Some(b"t1".to_vec()));
    }
}
