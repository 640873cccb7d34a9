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
    /// 422: the list options fail the API server's validation (`ValidateListOptions`:
    /// resourceVersionMatch without a resourceVersion, Exact with "0", an unknown match, ...).
    Invalid,
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
    /// 500 with no reason (`StatusReasonUnknown`, `""`): an error that is not a Kubernetes
    /// status, as `ErrorToAPIStatus` reports it (v1.37's invalid keys).
    Unknown,
}

impl Reason {
    /// The reason as Kubernetes spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Invalid => "Invalid",
            Reason::NotFound => "NotFound",
            Reason::Expired => "Expired",
            Reason::Timeout => "Timeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::InternalError => "InternalError",
            Reason::Unknown => "",
        }
    }

    /// The HTTP status code that goes with the reason.
    pub const fn code(self) -> u16 {
        match self {
            Reason::BadRequest => 400,
            Reason::Invalid => 422,
            Reason::NotFound => 404,
            Reason::Expired => 410,
            Reason::Timeout => 504,
            Reason::TooManyRequests => 429,
            Reason::ServiceUnavailable => 503,
            Reason::InternalError | Reason::Unknown => 500,
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

    /// 504 "Timeout: Too large resource version" with Retry-After 1, as `storage/errors.go`
    /// builds it (`NewTimeoutError` prefixes its message with "Timeout: ").
    pub fn too_large(requested: u64, current: u64) -> Status {
        Status {
            reason: Reason::Timeout,
            message: format!(
                "Timeout: Too large resource version: {requested}, current: {current}"
            ),
            retry_after_s: Some(1),
        }
    }

    /// 404 for a key, as the registry words it (`InterpretGetError` → `NewNotFound`):
    /// `pods "zzz" not found`, the resource being the key's first path segment and the name
    /// its last (`/pods/ns/zzz`). See [`Status::not_found_in`] when the resource is known.
    pub fn not_found(key: &[u8]) -> Status {
        let key = crate::key::display_key(key);
        let resource = key.trim_start_matches('/').split('/').next().unwrap_or("");
        let name = key.rsplit('/').next().unwrap_or("");
        Status::not_found_in(resource, name)
    }

    /// 404 `<resource> "<name>" not found` (apimachinery's `NewNotFound`).
    pub fn not_found_in(resource: &str, name: &str) -> Status {
        Status::new(Reason::NotFound, format!("{resource} {} not found", go_quote(name)))
    }

    /// 422 for list options that fail validation, as `NewInvalid(ListOptions)` words it:
    /// `ListOptions.meta.k8s.io "" is invalid: <error>` (several errors in brackets,
    /// duplicates once, as `ErrorList.ToAggregate`).
    pub fn invalid_list_options<S: AsRef<str>>(errors: &[S]) -> Status {
        let mut seen: alloc::vec::Vec<&str> = alloc::vec::Vec::new();
        for e in errors {
            if !seen.contains(&e.as_ref()) {
                seen.push(e.as_ref());
            }
        }
        let body = match seen.as_slice() {
            [] => String::new(),
            [one] => format!(": {one}"),
            many => format!(": [{}]", many.join(", ")),
        };
        Status::new(Reason::Invalid, format!("ListOptions.meta.k8s.io \"\" is invalid{body}"))
    }

    /// 503 as returned by a cache that has been stopped.
    pub fn stopped() -> Status {
        Status::new(Reason::ServiceUnavailable, "apiserver cacher is stopped")
    }

    /// True for a 504 "Too large resource version".
    pub fn is_too_large_resource_version(&self) -> bool {
        self.reason == Reason::Timeout
            && self.message.starts_with("Timeout: Too large resource version")
    }
}

/// Go's `strconv.Quote` (what `%q` prints): `"`-delimited, `"` and `\\` escaped, control
/// characters as `\n`, `\t`, ... or `\xNN`, other non-printable characters as `\uNNNN`.
pub(crate) fn go_quote(s: &str) -> String {
    use core::fmt::Write;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if !c.is_ascii() && (c.is_control() || c.is_whitespace()) => {
                if (c as u32) < 0x10000 {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                } else {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code(), self.reason.as_str(), self.message)
    }
}

impl core::error::Error for Status {}
