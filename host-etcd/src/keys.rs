//! Keys at the edge: etcd's `key`/`range_end` conventions and the library's [`Keys`], turned
//! into the core's [`KeyRange`] in one place, and back.
//!
//! etcd counterpart: the range conventions of `api/etcdserverpb/rpc.proto` (`RangeRequest`,
//! `WatchCreateRequest`) and clientv3's `WithPrefix`/`WithFromKey`/`WithRange`
//! (`client/v3/op.go`).

use cacher_core::{Key, KeyRange};

/// Which keys a watch or get selects (etcd's key and range-end conventions, spelled out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// One key.
    Key(Vec<u8>),
    /// Every key starting with the prefix (`""`: every key).
    Prefix(Vec<u8>),
    /// The keys in `[start, end)`.
    Range(Vec<u8>, Vec<u8>),
    /// Every key from this one on.
    FromKey(Vec<u8>),
}

impl Keys {
    /// One key.
    pub fn key(k: impl Into<Vec<u8>>) -> Keys {
        Keys::Key(k.into())
    }

    /// A prefix.
    pub fn prefix(p: impl Into<Vec<u8>>) -> Keys {
        Keys::Prefix(p.into())
    }

    /// A range `[start, end)`.
    pub fn range(start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Keys {
        Keys::Range(start.into(), end.into())
    }

    /// Every key from `k` on.
    pub fn from_key(k: impl Into<Vec<u8>>) -> Keys {
        Keys::FromKey(k.into())
    }

    /// etcd's `key` and `range_end` for these keys.
    pub fn etcd(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Keys::Key(k) => (k.clone(), Vec::new()),
            Keys::Prefix(p) => prefix_range(p),
            Keys::Range(s, e) => (s.clone(), e.clone()),
            Keys::FromKey(k) => (k.clone(), vec![0]),
        }
    }

    /// The core's range for these keys (a malformed range is an error, as etcd says it).
    pub fn key_range(&self) -> Result<KeyRange, String> {
        let (k, e) = self.etcd();
        etcd_key_range(&k, &e)
    }
}

/// The core's range for an etcd request's `key` and `range_end` (`Range`'s rules: an empty key
/// is refused; the watch server first replaces it by `"\0"`, see [`watch_key_range`]).
pub fn etcd_key_range(key: &[u8], range_end: &[u8]) -> Result<KeyRange, String> {
    KeyRange::etcd(key, range_end).map_err(|s| s.message)
}

/// The core's range of a watch request, normalised as etcd's watch server does it: an empty
/// key is `"\0"`, the smallest key.
pub fn watch_key_range(key: &[u8], range_end: &[u8]) -> Result<KeyRange, String> {
    let key: &[u8] = if key.is_empty() { b"\0" } else { key };
    etcd_key_range(key, range_end)
}

/// etcd's `key` and `range_end` for a core range: the inverse of [`etcd_key_range`]. A path
/// prefix (Kubernetes' recursive requests) becomes the byte prefix that covers it; the caller
/// filters by path where that matters.
pub fn etcd_range(range: &KeyRange) -> (Vec<u8>, Vec<u8>) {
    match range {
        KeyRange::Exact(k) => (k.as_bytes().to_vec(), Vec::new()),
        KeyRange::Prefix(p) => prefix_range(p.as_bytes()),
        KeyRange::Range { start, end } => {
            (start.as_bytes().to_vec(), end.as_ref().map_or(vec![0], |e| e.as_bytes().to_vec()))
        }
    }
}

/// One key inside a cached prefix that costs etcd the same to read or watch whatever the
/// store holds: the prefix itself (`\0` for the whole keyspace). The revision checks (quorum
/// read, compaction probe, revision probe) use it.
pub fn probe_key(prefix: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        vec![0]
    } else {
        prefix.to_vec()
    }
}

/// The etcd key range of a prefix: `[prefix, prefix_end)`; every key for `""`.
pub fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let end = cacher_core::prefix_end(prefix).unwrap_or_else(|| vec![0]);
    (prefix.to_vec(), end)
}

/// The core range of a cached prefix (the byte range etcd lists and watches).
pub fn prefix_key_range(prefix: &[u8]) -> KeyRange {
    let (start, end) = prefix_range(prefix);
    KeyRange::Range { start: Key::new(&start), end: (end != [0]).then(|| Key::new(&end)) }
}

/// Whether every key of `range` starts with `prefix`.
pub fn range_within_prefix(range: &KeyRange, prefix: &[u8]) -> bool {
    if prefix.is_empty() {
        return true;
    }
    match range {
        KeyRange::Exact(k) | KeyRange::Prefix(k) => k.as_bytes().starts_with(prefix),
        KeyRange::Range { start, end } => {
            let Some(end) = end else { return false };
            let Some(pend) = cacher_core::prefix_end(prefix) else {
                return start.as_bytes().starts_with(prefix);
            };
            start.as_bytes() >= prefix && end.as_bytes() <= pend.as_slice()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_conventions_round_trip() {
        for keys in [
            Keys::key("/reg/a"),
            Keys::prefix("/reg/"),
            Keys::range("/reg/a", "/reg/c"),
            Keys::from_key("/reg/b"),
        ] {
            let range = keys.key_range().expect("valid");
            assert_eq!(etcd_range(&range), keys.etcd(), "{keys:?}");
        }
        assert_eq!(Keys::prefix("").etcd(), (vec![0], vec![0]));
        assert!(Keys::range("/b", "/a").key_range().is_err());
        assert!(Keys::key("").key_range().is_err());
        // A watch's empty key is etcd's "\0"; a range's is refused.
        assert_eq!(
            watch_key_range(b"", b"\0"),
            Ok(KeyRange::Range { start: Key::new(b"\0"), end: None })
        );
        assert_eq!(watch_key_range(b"", b""), Ok(KeyRange::Exact(Key::new(b"\0"))));
        assert!(etcd_key_range(b"", b"").is_err());
    }

    #[test]
    fn ranges_within_prefix() {
        let p = b"/reg/";
        assert!(range_within_prefix(&KeyRange::Exact(Key::from("/reg/a")), p));
        assert!(!range_within_prefix(&KeyRange::Exact(Key::from("/other")), p));
        assert!(range_within_prefix(
            &KeyRange::Range { start: Key::from("/reg/"), end: Some(Key::from("/reg0")) },
            p
        ));
        assert!(!range_within_prefix(
            &KeyRange::Range { start: Key::from("/reg/"), end: Some(Key::from("/reh")) },
            p
        ));
        assert!(!range_within_prefix(&KeyRange::Range { start: Key::from("/reg/"), end: None }, p));
        assert!(range_within_prefix(&KeyRange::Range { start: Key::from("a"), end: None }, b""));
        assert!(range_within_prefix(
            &KeyRange::Range { start: Key::from("/a"), end: Some(Key::from("0")) },
            b"/"
        ));
        assert!(range_within_prefix(&prefix_key_range(b"/reg/"), p));
    }
}
