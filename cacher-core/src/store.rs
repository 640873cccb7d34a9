//! The current state: objects ordered by key, the trigger index, and snapshots at past
//! revisions.
//!
//! Kubernetes counterparts: `store_btree.go` (ordered store, `ListPrefix`, `Count`, the
//! indexer), `watch_cache.go` (`Replace`, `WaitUntilFreshAndList`'s index choice) and the
//! snapshot ring of 1.33+ (`storeSnapshotter`: `Add`, `GetLessOrEqual`, `RemoveLess`, `Reset`).
//! Snapshots are clones of the persistent tree, so they share structure with the current state.

use alloc::boxed::Box;
use alloc::collections::{BTreeSet, VecDeque};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::ControlFlow;

use crate::btree::Tree;
use crate::hash::HashMap;
use crate::key::KeyRange;
use crate::object::Object;
use crate::selector::Selector;

/// An object ordered by its key (for the index's sets).
#[derive(Clone)]
struct ByKey(Arc<Object>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}
impl Eq for ByKey {}
impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        self.0.key().cmp(other.0.key())
    }
}
impl core::borrow::Borrow<[u8]> for ByKey {
    fn borrow(&self) -> &[u8] {
        self.0.key()
    }
}

/// A page of a list.
#[derive(Clone, Debug, Default)]
pub(crate) struct Page {
    pub items: Vec<Arc<Object>>,
    /// Objects looked at (Kubernetes' `fetched` metric).
    pub scanned: usize,
    /// The key to continue from (last returned key + `\0`), when more keys remain.
    pub continue_key: Option<Vec<u8>>,
    /// Keys left after this page, when counted (only without a selector).
    pub remaining: Option<u64>,
    /// The index used, e.g. `f:spec.nodeName`.
    pub index: Option<Box<str>>,
}

/// What to list.
pub(crate) struct Query<'a> {
    pub range: &'a KeyRange,
    /// Start at this key (inclusive), from a continue token.
    pub start: Option<&'a [u8]>,
    pub selector: &'a Selector,
    /// 0 = everything.
    pub limit: usize,
    /// Count the keys left after a page (`remainingItemCount`; only without a selector).
    pub count_remaining: bool,
}

pub(crate) struct Store {
    tree: Tree,
    index_field: Option<Box<str>>,
    index: HashMap<Box<str>, BTreeSet<ByKey>>,
    snapshots_enabled: bool,
    snapshots: VecDeque<(u64, Tree)>,
}

impl Store {
    pub(crate) fn new(index_field: Option<Box<str>>, snapshots: bool) -> Store {
        Store {
            tree: Tree::new(),
            index_field,
            index: HashMap::default(),
            snapshots_enabled: snapshots,
            snapshots: VecDeque::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.tree.len()
    }

    pub(crate) fn tree(&self) -> &Tree {
        &self.tree
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Arc<Object>> {
        self.tree.get(key)
    }

    /// `Replace`: the new state, sorted, with a snapshot at the list RV.
    pub(crate) fn replace(&mut self, objects: Vec<Arc<Object>>, rv: u64) {
        self.tree = Tree::from_sorted(objects);
        self.index.clear();
        if let Some(field) = self.index_field.clone() {
            for o in self.tree.to_vec() {
                self.index_insert(&field, o);
            }
        }
        self.snapshots.clear();
        self.snapshot(rv);
    }

    /// Stores `obj` (already carrying its etcd metadata); returns the previous version.
    pub(crate) fn put(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let prev = self.tree.insert(obj.clone());
        if let Some(field) = self.index_field.clone() {
            if let Some(p) = &prev {
                self.index_remove(&field, p);
            }
            self.index_insert(&field, obj);
        }
        prev
    }

    pub(crate) fn delete(&mut self, key: &[u8]) -> Option<Arc<Object>> {
        let prev = self.tree.remove(key)?;
        if let Some(field) = self.index_field.clone() {
            self.index_remove(&field, &prev);
        }
        Some(prev)
    }

    /// Records the current state as the snapshot at `rv` (one per revision).
    pub(crate) fn snapshot(&mut self, rv: u64) {
        if !self.snapshots_enabled {
            return;
        }
        match self.snapshots.back_mut() {
            Some((last, tree)) if *last == rv => *tree = self.tree.clone(),
            _ => self.snapshots.push_back((rv, self.tree.clone())),
        }
    }

    /// Drops snapshots older than `rv` (evicted from the window, or compacted in storage).
    pub(crate) fn prune_snapshots_below(&mut self, rv: u64) {
        while self.snapshots.front().is_some_and(|(r, _)| *r < rv) {
            self.snapshots.pop_front();
        }
    }

    /// The newest snapshot at or before `rv`, as `GetLessOrEqual`.
    pub(crate) fn snapshot_at(&self, rv: u64) -> Option<&Tree> {
        let i = self.snapshots.partition_point(|(r, _)| *r <= rv);
        i.checked_sub(1).map(|i| &self.snapshots[i].1)
    }

    pub(crate) fn snapshot_count(&self) -> usize {
        self.snapshots.len()
    }

    pub(crate) fn snapshots_enabled(&self) -> bool {
        self.snapshots_enabled
    }

    pub(crate) fn oldest_snapshot_rv(&self) -> Option<u64> {
        self.snapshots.front().map(|(r, _)| *r)
    }

    /// Lists the current state, using the trigger index when the selector pins its field.
    pub(crate) fn list(&self, q: &Query<'_>) -> Page {
        if let Some(field) = &self.index_field {
            if let Some(value) = q.selector.fields.requires_exact_match(field) {
                let mut page = self.list_by_index(value, q);
                page.index = Some(alloc::format!("f:{field}").into_boxed_str());
                return page;
            }
        }
        list_tree(&self.tree, q)
    }

    fn list_by_index(&self, value: &str, q: &Query<'_>) -> Page {
        let mut page = Page::default();
        let Some(set) = self.index.get(value) else { return page };
        let start = q.start.unwrap_or(&[]);
        let mut iter =
            set.range::<[u8], _>((core::ops::Bound::Included(start), core::ops::Bound::Unbounded));
        for ByKey(o) in iter.by_ref() {
            if !q.range.contains(o.key()) {
                continue;
            }
            if q.limit > 0 && page.items.len() == q.limit {
                page.continue_key = page.items.last().map(|l| continue_after(l.key()));
                break;
            }
            page.scanned += 1;
            if q.selector.matches(o) {
                page.items.push(o.clone());
            }
        }
        page
    }

    fn index_insert(&mut self, field: &str, obj: Arc<Object>) {
        let value = obj.field(field).unwrap_or("");
        match self.index.get_mut(value) {
            Some(set) => {
                set.insert(ByKey(obj));
            }
            None => {
                let mut set = BTreeSet::new();
                let key = Box::from(value);
                set.insert(ByKey(obj));
                self.index.insert(key, set);
            }
        }
    }

    fn index_remove(&mut self, field: &str, obj: &Object) {
        let value = obj.field(field).unwrap_or("");
        if let Some(set) = self.index.get_mut(value) {
            set.remove(obj.key());
            if set.is_empty() {
                self.index.remove(value);
            }
        }
    }
}

/// The key after `key` in byte order: where a continuation starts.
pub(crate) fn continue_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// Lists a tree (the current state or a snapshot).
pub(crate) fn list_tree(tree: &Tree, q: &Query<'_>) -> Page {
    let mut page = Page::default();
    if let KeyRange::Exact(k) = q.range {
        if q.start.is_none_or(|s| k.as_bytes() >= s) {
            if let Some(o) = tree.get(k.as_bytes()) {
                page.scanned = 1;
                if q.selector.matches(o) {
                    page.items.push(o.clone());
                }
            }
        }
        return page;
    }
    let mut more = false;
    'intervals: for (lo, hi) in q.range.intervals() {
        let from: &[u8] = match q.start {
            Some(s) if s > lo.as_slice() => s,
            _ => &lo,
        };
        if hi.as_deref().is_some_and(|h| from >= h) {
            continue;
        }
        let stop = tree.for_each_from(from, |o| {
            if hi.as_deref().is_some_and(|h| o.key() >= h) {
                return ControlFlow::Break(false);
            }
            if q.limit > 0 && page.items.len() == q.limit {
                // Any key left in range means more (Kubernetes' hasMore counts scanned keys).
                return ControlFlow::Break(true);
            }
            page.scanned += 1;
            if q.selector.matches(o) {
                page.items.push(o.clone());
            }
            ControlFlow::Continue(())
        });
        if stop == Some(true) {
            more = true;
            break 'intervals;
        }
    }
    if more {
        if let Some(last) = page.items.last() {
            let next = continue_after(last.key());
            if q.selector.is_empty() && q.count_remaining {
                let remaining: usize = q
                    .range
                    .intervals()
                    .iter()
                    .map(|(lo, hi)| {
                        let from = if next.as_slice() > lo.as_slice() { &next } else { lo };
                        match hi {
                            Some(h) if from.as_slice() >= h.as_slice() => 0,
                            _ => tree.count_range(from, hi.as_deref()),
                        }
                    })
                    .sum();
                page.remaining = Some(remaining as u64);
            }
            page.continue_key = Some(next);
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use crate::object::Attrs;
    use alloc::format;

    fn pod(ns: &str, name: &str, node: &str, rv: u64) -> Arc<Object> {
        Arc::new(Object::new(format!("/pods/{ns}/{name}").as_bytes(), Some(b"v"), rv).with_attrs(
            Attrs::new(
                [("app", "web")],
                [("metadata.namespace", ns), ("metadata.name", name), ("spec.nodeName", node)],
            ),
        ))
    }

    fn keys(p: &Page) -> Vec<alloc::string::String> {
        p.items.iter().map(|o| crate::key::display_key(o.key())).collect()
    }

    #[test]
    fn prefix_list_respects_path_segments_and_pages() {
        let mut s = Store::new(None, false);
        let mut objs: Vec<_> = ["ns1/a", "ns1/b", "ns1/c", "ns10/a", "ns2/a"]
            .iter()
            .map(|k| {
                let (ns, n) = k.split_once('/').unwrap();
                pod(ns, n, "", 5)
            })
            .collect();
        objs.sort_by(|a, b| a.key().cmp(b.key()));
        s.replace(objs, 5);
        let sel = Selector::default();
        let r = KeyRange::Prefix(Key::from("/pods/ns1"));
        let all = s.list(&Query {
            range: &r,
            start: None,
            selector: &sel,
            limit: 0,
            count_remaining: true,
        });
        assert_eq!(keys(&all), ["/pods/ns1/a", "/pods/ns1/b", "/pods/ns1/c"]);
        let p1 = s.list(&Query {
            range: &r,
            start: None,
            selector: &sel,
            limit: 2,
            count_remaining: true,
        });
        assert_eq!(keys(&p1), ["/pods/ns1/a", "/pods/ns1/b"]);
        assert_eq!(p1.remaining, Some(1));
        let next = p1.continue_key.unwrap();
        let p2 = s.list(&Query {
            range: &r,
            start: Some(&next),
            selector: &sel,
            limit: 2,
            count_remaining: true,
        });
        assert_eq!(keys(&p2), ["/pods/ns1/c"]);
        assert!(p2.continue_key.is_none());
    }

    #[test]
    fn index_serves_exact_field_matches() {
        let mut s = Store::new(Some("spec.nodeName".into()), false);
        s.replace(alloc::vec![pod("ns", "a", "n1", 1), pod("ns", "b", "n2", 1)], 1);
        s.put(pod("ns", "c", "n1", 2));
        s.put(pod("ns", "a", "n2", 3));
        let sel = Selector::parse("", "spec.nodeName=n1").unwrap();
        let r = KeyRange::Prefix(Key::from("/pods/"));
        let p = s.list(&Query {
            range: &r,
            start: None,
            selector: &sel,
            limit: 0,
            count_remaining: true,
        });
        assert_eq!(keys(&p), ["/pods/ns/c"]);
        assert_eq!(p.index.as_deref(), Some("f:spec.nodeName"));
        s.delete(b"/pods/ns/c");
        let p = s.list(&Query {
            range: &r,
            start: None,
            selector: &sel,
            limit: 0,
            count_remaining: true,
        });
        assert!(p.items.is_empty());
    }

    #[test]
    fn snapshots_answer_past_revisions() {
        let mut s = Store::new(None, true);
        s.replace(alloc::vec![pod("ns", "a", "", 10)], 10);
        s.put(pod("ns", "b", "", 11));
        s.snapshot(11);
        s.delete(b"/pods/ns/a");
        s.snapshot(12);
        assert_eq!(s.snapshot_at(10).unwrap().len(), 1);
        assert_eq!(s.snapshot_at(11).unwrap().len(), 2);
        assert_eq!(s.snapshot_at(15).unwrap().len(), 1);
        assert!(s.snapshot_at(9).is_none());
        s.prune_snapshots_below(12);
        assert!(s.snapshot_at(11).is_none());
        assert_eq!(s.snapshot_count(), 1);
    }
}
