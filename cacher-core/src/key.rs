//! Storage keys and the key ranges that watches and lists select.
//!
//! Kubernetes counterpart: `util.go` (`hasPathPrefix`), plus etcd's byte ranges
//! (`[key, range_end)`) for the etcd host. A key is bytes; Kubernetes keys are UTF-8 paths.

use alloc::borrow::ToOwned;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::status::Status;

/// A storage key: cheap to clone, compared bytewise (etcd's order).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(Arc<[u8]>);

impl Key {
    /// A key from its bytes.
    pub fn new(bytes: &[u8]) -> Key {
        Key(Arc::from(bytes))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Key {
        Key::new(s.as_bytes())
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Key {
        Key::new(b)
    }
}

impl core::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl core::fmt::Debug for Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", display_key(&self.0))
    }
}

/// The key as text: UTF-8 as is, other bytes escaped as `\xNN`.
pub fn display_key(key: &[u8]) -> String {
    match core::str::from_utf8(key) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut out = String::with_capacity(key.len() * 2);
            for chunk in key.utf8_chunks() {
                out.push_str(chunk.valid());
                for b in chunk.invalid() {
                    use core::fmt::Write;
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out
        }
    }
}

/// Path-segment prefix match, as Kubernetes' `hasPathPrefix`: `/pods/ns1` matches `/pods/ns1`
/// and `/pods/ns1/a`, not `/pods/ns10/a`. An empty prefix matches everything.
pub fn has_path_prefix(s: &[u8], prefix: &[u8]) -> bool {
    if prefix.is_empty() {
        return true;
    }
    if !s.starts_with(prefix) {
        return false;
    }
    s.len() == prefix.len() || prefix.ends_with(b"/") || s[prefix.len()] == b'/'
}

/// The smallest key greater than every key that starts with `prefix`, as etcd computes a prefix
/// range end (`None` when no such key exists: the prefix is empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Which keys a watch or list selects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyRange {
    /// Every key under a path prefix (Kubernetes recursive requests).
    Prefix(Key),
    /// One key (Kubernetes non-recursive requests, etcd single-key requests).
    Exact(Key),
    /// The etcd byte range `[start, end)`; `end: None` means no upper bound ("from key").
    Range {
        /// Inclusive start.
        start: Key,
        /// Exclusive end, or unbounded.
        end: Option<Key>,
    },
}

impl KeyRange {
    /// A Kubernetes-style range: recursive requests select a path prefix, others one key.
    pub fn kubernetes(key: &str, recursive: bool) -> Result<KeyRange, Status> {
        if recursive {
            Ok(KeyRange::Prefix(Key::from(key)))
        } else if key.is_empty() {
            Err(Status::bad_request("key: Required value: a non-recursive request needs a key"))
        } else {
            Ok(KeyRange::Exact(Key::from(key)))
        }
    }

    /// An etcd-style range from a request's `key` and `range_end`, with etcd's conventions:
    /// an empty `range_end` selects one key, `"\0"` selects every key from `key` on, an empty key
    /// with `"\0"` selects everything, otherwise `[key, range_end)`.
    pub fn etcd(key: &[u8], range_end: &[u8]) -> Result<KeyRange, Status> {
        if range_end.is_empty() {
            if key.is_empty() {
                return Err(Status::bad_request("etcdserver: key is not provided"));
            }
            return Ok(KeyRange::Exact(Key::new(key)));
        }
        if range_end == b"\0" {
            return Ok(KeyRange::Range { start: Key::new(key), end: None });
        }
        if range_end <= key {
            return Err(Status::bad_request("etcdserver: range end must be greater than key"));
        }
        Ok(KeyRange::Range { start: Key::new(key), end: Some(Key::new(range_end)) })
    }

    /// True if `key` is selected.
    #[inline]
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Prefix(p) => has_path_prefix(key, p.as_bytes()),
            KeyRange::Exact(k) => k.as_bytes() == key,
            KeyRange::Range { start, end } => {
                key >= start.as_bytes() && end.as_ref().is_none_or(|e| key < e.as_bytes())
            }
        }
    }

    /// An identity for memoising `contains` over ranges that share their keys' allocations
    /// (watchers of the same prefix): equal identities mean equal ranges.
    #[inline]
    pub(crate) fn identity(&self) -> (u8, usize, usize) {
        match self {
            KeyRange::Prefix(p) => (0, p.0.as_ptr() as usize, p.0.len()),
            KeyRange::Exact(k) => (1, k.0.as_ptr() as usize, k.0.len()),
            KeyRange::Range { start, end } => {
                (2, start.0.as_ptr() as usize, end.as_ref().map_or(0, |e| e.0.as_ptr() as usize))
            }
        }
    }

    /// True if the range selects at most one key.
    pub fn is_single_key(&self) -> bool {
        matches!(self, KeyRange::Exact(_))
    }

    /// The byte intervals `[start, end)` that cover the range exactly, in key order
    /// (a path prefix without a trailing `/` is the prefix itself plus everything under `prefix/`).
    pub(crate) fn intervals(&self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        match self {
            KeyRange::Prefix(p) => {
                let p = p.as_bytes();
                if p.is_empty() {
                    alloc::vec![(Vec::new(), None)]
                } else if p.ends_with(b"/") {
                    alloc::vec![(p.to_vec(), prefix_end(p))]
                } else {
                    let mut exact_end = p.to_vec();
                    exact_end.push(0);
                    let mut sub = p.to_vec();
                    sub.push(b'/');
                    let sub_end = prefix_end(&sub);
                    alloc::vec![(p.to_vec(), Some(exact_end)), (sub, sub_end)]
                }
            }
            KeyRange::Exact(k) => {
                let mut end = k.as_bytes().to_vec();
                end.push(0);
                alloc::vec![(k.as_bytes().to_vec(), Some(end))]
            }
            KeyRange::Range { start, end } => {
                alloc::vec![(
                    start.as_bytes().to_vec(),
                    end.as_ref().map(|e| e.as_bytes().to_vec())
                )]
            }
        }
    }

    /// The lowest key the range can contain.
    pub fn start(&self) -> &[u8] {
        match self {
            KeyRange::Prefix(k) | KeyRange::Exact(k) => k.as_bytes(),
            KeyRange::Range { start, .. } => start.as_bytes(),
        }
    }

    /// True if every key of `self` is also in `outer`.
    pub fn is_within(&self, outer: &KeyRange) -> bool {
        match (self, outer) {
            (_, KeyRange::Prefix(p)) if p.as_bytes().is_empty() => true,
            (KeyRange::Exact(k), _) => outer.contains(k.as_bytes()),
            (KeyRange::Prefix(inner), KeyRange::Prefix(p)) => {
                has_path_prefix(inner.as_bytes(), p.as_bytes())
            }
            _ => {
                // Compare as byte intervals: every interval of self inside one of outer.
                let outer_iv = outer.intervals();
                self.intervals().iter().all(|(s, e)| {
                    outer_iv.iter().any(|(os, oe)| {
                        s >= os
                            && match (e, oe) {
                                (_, None) => true,
                                (None, Some(_)) => false,
                                (Some(e), Some(oe)) => e <= oe,
                            }
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_path_prefix_table() {
        // TestHasPathPrefix (util_test.go).
        for (s, p) in [
            ("", ""),
            ("a", "a"),
            ("a/", "a/"),
            ("a/../", "a/../"),
            ("a/b", "a"),
            ("a/b", "a/"),
            ("中文/", "中文"),
        ] {
            assert!(has_path_prefix(s.as_bytes(), p.as_bytes()), "{s:?} {p:?}");
        }
        for (s, p) in [
            ("a", "b"),
            ("a", "a/"),
            ("ns2", "ns"),
            ("ns2", "ns/"),
            ("中文文", "中文"),
            ("a/c/../b/", "a/b/"),
            ("a/", "a/b/.."),
        ] {
            assert!(!has_path_prefix(s.as_bytes(), p.as_bytes()), "{s:?} {p:?}");
        }
    }

    #[test]
    fn etcd_ranges() {
        assert_eq!(KeyRange::etcd(b"a", b"").unwrap(), KeyRange::Exact(Key::from("a")));
        assert!(KeyRange::etcd(b"", b"").is_err());
        let all = KeyRange::etcd(b"", b"\0").unwrap();
        assert!(all.contains(b"") && all.contains(b"\xff\xff"));
        let from = KeyRange::etcd(b"m", b"\0").unwrap();
        assert!(from.contains(b"m") && from.contains(b"z") && !from.contains(b"a"));
        let r = KeyRange::etcd(b"a", b"c").unwrap();
        assert!(r.contains(b"a") && r.contains(b"bzz") && !r.contains(b"c"));
        assert_eq!(KeyRange::etcd(b"c", b"a").unwrap_err().code(), 400);
        assert_eq!(prefix_end(b"ab").unwrap(), b"ac");
        assert_eq!(prefix_end(b"a\xff").unwrap(), b"b");
        assert_eq!(prefix_end(b"\xff"), None);
    }

    #[test]
    fn intervals_cover_path_prefix_exactly() {
        let r = KeyRange::Prefix(Key::from("/pods/ns1"));
        let iv = r.intervals();
        let inside =
            |k: &[u8]| iv.iter().any(|(s, e)| k >= &s[..] && e.as_ref().is_none_or(|e| k < &e[..]));
        for k in ["/pods/ns1", "/pods/ns1/a", "/pods/ns10/a", "/pods/ns1a", "/pods/ns0"] {
            assert_eq!(inside(k.as_bytes()), r.contains(k.as_bytes()), "{k}");
        }
    }

    #[test]
    fn within() {
        let outer = KeyRange::Prefix(Key::from("/pods/"));
        assert!(KeyRange::Exact(Key::from("/pods/a")).is_within(&outer));
        assert!(KeyRange::Prefix(Key::from("/pods/ns")).is_within(&outer));
        assert!(!KeyRange::Prefix(Key::from("/pod")).is_within(&outer));
        assert!(KeyRange::etcd(b"/pods/a", b"/pods/b").unwrap().is_within(&outer));
        assert!(!KeyRange::etcd(b"/pods/a", b"\0").unwrap().is_within(&outer));
        assert!(!KeyRange::etcd(b"/a", b"/pods/b").unwrap().is_within(&outer));
    }
}
