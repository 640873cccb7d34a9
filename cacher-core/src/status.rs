//! Errors as a Kubernetes client sees them: an HTTP-style code, a reason and a message.
//!
//! Kubernetes counterparts: `storage/errors.go` (TooLargeResourceVersion, KeyNotFound, Invalid),
//! `apimachinery/pkg/api/errors` (Expired, ServiceUnavailable, TooManyRequests), and the conversion
//! of a watch error into a `metav1.Status` in `cacher.go`'s error watcher.

use alloc::format;
use alloc::string::String;
use core::fmt;

/// The `reason` of a Kubernetes `metav1.Status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 400: the request is malformed (bad resourceVersion, selector, limit, continue token ...).
    BadRequest,
    /// 404: the object does not exist.
    NotFound,
    /// 410: the requested resourceVersion is older than the cache's window.
    Expired,
    /// 504: the cache did not reach the requested resourceVersion in time.
    Timeout,
    /// 429: the cache is (re)initialising (Kubernetes 1.31+ resilient initialisation).
    TooManyRequests,
    /// 503: the cache is stopped, or a wait for readiness was abandoned.
    ServiceUnavailable,
    /// 500: an internal error, e.g. a watch cache that was never initialised.
    InternalError,
}

impl Reason {
    /// The reason as Kubernetes spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::NotFound => "NotFound",
            Reason::Expired => "Expired",
            Reason::Timeout => "Timeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::InternalError => "InternalError",
        }
    }

    /// The HTTP status code that goes with the reason.
    pub const fn code(self) -> u16 {
        match self {
            Reason::BadRequest => 400,
            Reason::NotFound => 404,
            Reason::Expired => 410,
            Reason::Timeout => 504,
            Reason::TooManyRequests => 429,
            Reason::ServiceUnavailable => 503,
            Reason::InternalError => 500,
        }
    }
}

/// A failure as the client sees it, the shape of a Kubernetes `metav1.Status` with
/// `status: Failure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Why it failed.
    pub reason: Reason,
    /// A human-readable message, worded as Kubernetes words it where Kubernetes has a wording.
    pub message: String,
    /// `Retry-After`, in seconds, where the client should retry.
    pub retry_after_s: Option<u32>,
}

impl Status {
    /// A status with the given reason and message.
    pub fn new(reason: Reason, message: impl Into<String>) -> Status {
        Status { reason, message: message.into(), retry_after_s: None }
    }

    /// The HTTP-style code.
    pub const fn code(&self) -> u16 {
        self.reason.code()
    }

    /// 400 with the message.
    pub fn bad_request(message: impl Into<String>) -> Status {
        Status::new(Reason::BadRequest, message)
    }

    /// 410 "too old resource version: X (Y)", as `watch_cache.go` words it.
    pub fn too_old(requested: u64, oldest_servable: u64) -> Status {
        Status::new(
            Reason::Expired,
            format!("too old resource version: {requested} ({oldest_servable})"),
        )
    }

    /// 504 "Too large resource version" with Retry-After 1, as `storage/errors.go` builds it.
    pub fn too_large(requested: u64, current: u64) -> Status {
        Status {
            reason: Reason::Timeout,
            message: format!("Too large resource version: {requested}, current: {current}"),
            retry_after_s: Some(1),
        }
    }

    /// 404 for a key.
    pub fn not_found(key: &[u8]) -> Status {
        Status::new(Reason::NotFound, format!("{} not found", crate::key::display_key(key)))
    }

    /// 503 as returned by a cache that has been stopped.
    pub fn stopped() -> Status {
        Status::new(Reason::ServiceUnavailable, "apiserver cacher is stopped")
    }

    /// True for a 504 "Too large resource version".
    pub fn is_too_large_resource_version(&self) -> bool {
        self.reason == Reason::Timeout && self.message.starts_with("Too large resource version")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code(), self.reason.as_str(), self.message)
    }
}

impl core::error::Error for Status {}
