//! Stored objects and their selectable attributes.
//!
//! Kubernetes counterpart: `storeElement` in `watch_cache.go` (key, object, labels, fields,
//! with labels and fields computed once at insertion by `GetAttrsFunc`). The etcd metadata
//! (`create_revision`, `version`, `lease`) rides along so the etcd host can answer `Range` as
//! etcd would.
//!
//! An object is immutable once built and shared by `Arc` between the store, its snapshots, the
//! ring buffer and every watcher's queue; nothing is ever copied per watcher.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Labels and fields of an object, sorted by name, computed once per object version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    labels: Box<[(Box<str>, Box<str>)]>,
    fields: Box<[(Box<str>, Box<str>)]>,
}

impl Attrs {
    /// Attributes from label and field pairs (any order; a later duplicate name wins).
    pub fn new<L, F, K1, V1, K2, V2>(labels: L, fields: F) -> Attrs
    where
        L: IntoIterator<Item = (K1, V1)>,
        F: IntoIterator<Item = (K2, V2)>,
        K1: Into<Box<str>>,
        V1: Into<Box<str>>,
        K2: Into<Box<str>>,
        V2: Into<Box<str>>,
    {
        Attrs {
            labels: sorted(labels.into_iter().map(|(k, v)| (k.into(), v.into())).collect()),
            fields: sorted(fields.into_iter().map(|(k, v)| (k.into(), v.into())).collect()),
        }
    }

    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        lookup(&self.labels, name)
    }

    /// The value of a field (e.g. `metadata.namespace`, `spec.nodeName`).
    pub fn field(&self, name: &str) -> Option<&str> {
        lookup(&self.fields, name)
    }

    /// All labels, sorted by name.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(k, v)| (&**k, &**v))
    }

    /// All fields, sorted by name.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields.iter().map(|(k, v)| (&**k, &**v))
    }

    /// True when there are neither labels nor fields.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

fn sorted(mut v: Vec<(Box<str>, Box<str>)>) -> Box<[(Box<str>, Box<str>)]> {
    // Stable sort keeps insertion order among equal names; keep the last one.
    v.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<(Box<str>, Box<str>)> = Vec::with_capacity(v.len());
    for (k, val) in v {
        match out.last_mut() {
            Some(last) if last.0 == k => last.1 = val,
            _ => out.push((k, val)),
        }
    }
    out.into_boxed_slice()
}

fn lookup<'a>(pairs: &'a [(Box<str>, Box<str>)], name: &str) -> Option<&'a str> {
    pairs.binary_search_by(|(k, _)| (**k).cmp(name)).ok().map(|i| &*pairs[i].1)
}

/// A stored object: its key, value, resourceVersion, etcd metadata and attributes.
///
/// Key and value share one allocation; the whole object is about 80 bytes beyond them.
#[derive(Clone, PartialEq, Eq)]
pub struct Object {
    rv: u64,
    create_rv: u64,
    version: i64,
    lease: i64,
    key_len: u32,
    has_value: bool,
    data: Box<[u8]>,
    attrs: Option<Arc<Attrs>>,
}

impl Object {
    /// An object at `rv` with no attributes and no etcd metadata (the store fills in
    /// `create_revision` and `version` as etcd would).
    ///
    /// Keys longer than 4 GiB are not representable; they are truncated (etcd's own limit on a
    /// request is 1.5 MiB).
    pub fn new(key: &[u8], value: Option<&[u8]>, rv: u64) -> Object {
        let key = &key[..key.len().min(u32::MAX as usize)];
        let value_bytes = value.unwrap_or(&[]);
        let mut data = Vec::with_capacity(key.len() + value_bytes.len());
        data.extend_from_slice(key);
        data.extend_from_slice(value_bytes);
        Object {
            rv,
            create_rv: 0,
            version: 0,
            lease: 0,
            key_len: key.len() as u32,
            has_value: value.is_some(),
            data: data.into_boxed_slice(),
            attrs: None,
        }
    }

    /// The same object with labels and fields (computed once, shared by every reader).
    pub fn with_attrs(mut self, attrs: Attrs) -> Object {
        self.attrs = if attrs.is_empty() { None } else { Some(Arc::new(attrs)) };
        self
    }

    /// The same object with shared attributes.
    pub fn with_shared_attrs(mut self, attrs: Option<Arc<Attrs>>) -> Object {
        self.attrs = attrs.filter(|a| !a.is_empty());
        self
    }

    /// The same object with etcd's metadata: `create_revision`, `version` and `lease`.
    pub fn with_etcd_meta(mut self, create_rv: u64, version: i64, lease: i64) -> Object {
        self.create_rv = create_rv;
        self.version = version;
        self.lease = lease;
        self
    }

    /// The same object at another resourceVersion (shares nothing with `self`).
    pub fn with_rv(&self, rv: u64) -> Object {
        let mut o = self.clone();
        o.rv = rv;
        o
    }

    /// The storage key.
    #[inline]
    pub fn key(&self) -> &[u8] {
        &self.data[..self.key_len as usize]
    }

    /// The value, if any.
    #[inline]
    pub fn value(&self) -> Option<&[u8]> {
        self.has_value.then(|| &self.data[self.key_len as usize..])
    }

    /// The object's own resourceVersion (etcd's `mod_revision`).
    #[inline]
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// etcd's `create_revision` (0 if unknown).
    pub fn create_rv(&self) -> u64 {
        self.create_rv
    }

    /// etcd's `version`: writes since creation, 1 for a new key (0 if unknown).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// etcd's `lease` id (0 = none).
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Labels and fields, if any.
    #[inline]
    pub fn attrs(&self) -> Option<&Attrs> {
        self.attrs.as_deref()
    }

    /// The shared attributes, to reuse them for another version of the object.
    pub fn shared_attrs(&self) -> Option<&Arc<Attrs>> {
        self.attrs.as_ref()
    }

    /// A label's value.
    #[inline]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.attrs.as_ref().and_then(|a| a.label(name))
    }

    /// A field's value.
    #[inline]
    pub fn field(&self, name: &str) -> Option<&str> {
        self.attrs.as_ref().and_then(|a| a.field(name))
    }

    /// Bytes this object allocates beyond its key and value (for the memory report).
    pub fn overhead_bytes(&self) -> usize {
        // The Arc<Object> allocation: two counters plus the struct.
        2 * core::mem::size_of::<usize>() + core::mem::size_of::<Object>()
    }

    pub(crate) fn set_etcd_meta_if_unknown(&mut self, prev: Option<&Object>) {
        if self.create_rv == 0 {
            match prev {
                Some(p) => {
                    self.create_rv = p.create_rv;
                    self.version = p.version.saturating_add(1);
                }
                None => {
                    self.create_rv = self.rv;
                    self.version = 1;
                }
            }
        } else if self.version == 0 {
            self.version = 1;
        }
    }
}

impl core::fmt::Debug for Object {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut d = f.debug_struct("Object");
        d.field("key", &crate::key::display_key(self.key()));
        d.field("rv", &self.rv);
        if let Some(v) = self.value() {
            d.field("value", &crate::key::display_key(v));
        }
        if let Some(a) = &self.attrs {
            d.field("attrs", a);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_value_share_one_allocation() {
        let o = Object::new(b"/pods/ns/a", Some(b"v1"), 7);
        assert_eq!(o.key(), b"/pods/ns/a");
        assert_eq!(o.value(), Some(&b"v1"[..]));
        assert_eq!(o.rv(), 7);
        let none = Object::new(b"/k", None, 1);
        assert_eq!(none.value(), None);
        let empty = Object::new(b"/k", Some(b""), 1);
        assert_eq!(empty.value(), Some(&b""[..]));
        assert!(core::mem::size_of::<Object>() <= 64, "{}", core::mem::size_of::<Object>());
    }

    #[test]
    fn attrs_are_sorted_and_last_wins() {
        let a = Attrs::new([("b", "2"), ("a", "1"), ("b", "3")], [("spec.nodeName", "n1")]);
        assert_eq!(a.label("a"), Some("1"));
        assert_eq!(a.label("b"), Some("3"));
        assert_eq!(a.label("c"), None);
        assert_eq!(a.field("spec.nodeName"), Some("n1"));
        let o = Object::new(b"k", None, 1).with_attrs(a);
        assert_eq!(o.label("a"), Some("1"));
        let bare = Object::new(b"k", None, 1).with_attrs(Attrs::default());
        assert!(bare.attrs().is_none());
    }
}
