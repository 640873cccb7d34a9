//! A persistent (copy-on-write) B+tree of objects ordered by key.
//!
//! Kubernetes counterpart: `store_btree.go` (1.32+), a B-tree whose `Clone()` is O(1) and lazy,
//! used for the current state and for the per-revision snapshots of 1.33+. Here a clone shares
//! every node; a write copies only the nodes on its path that a clone still shares
//! (`Arc::make_mut`), so a snapshot per event costs a handful of nodes, not a copy of the store.
//!
//! Internal nodes keep the number of objects below them, so counting a key range is
//! O(log n) (for `remainingItemCount`).

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::ops::ControlFlow;

use crate::object::Object;

/// Maximum entries of a leaf and children of an internal node.
const MAX: usize = 32;
/// Minimum, except at the root.
const MIN: usize = MAX / 2;

#[derive(Clone)]
enum Node {
    Leaf(Vec<Arc<Object>>),
    Internal(Internal),
}

#[derive(Clone)]
struct Internal {
    /// `seps[i]` is a lower bound of every key in `children[i + 1]` and greater than every key
    /// in `children[i]`.
    seps: Vec<Arc<[u8]>>,
    children: Vec<Arc<Node>>,
    /// Objects below this node.
    len: usize,
}

impl Node {
    fn len(&self) -> usize {
        match self {
            Node::Leaf(items) => items.len(),
            Node::Internal(n) => n.len,
        }
    }

    fn width(&self) -> usize {
        match self {
            Node::Leaf(items) => items.len(),
            Node::Internal(n) => n.children.len(),
        }
    }

    fn first_key(&self) -> Option<&[u8]> {
        match self {
            Node::Leaf(items) => items.first().map(|o| o.key()),
            Node::Internal(n) => n.children.first().and_then(|c| c.first_key()),
        }
    }
}

impl Internal {
    #[inline]
    fn child_for(&self, key: &[u8]) -> usize {
        self.seps.partition_point(|s| &**s <= key)
    }

    fn recount(&mut self) {
        self.len = self.children.iter().map(|c| c.len()).sum();
    }
}

/// An ordered map from key to object with O(1) snapshots.
#[derive(Clone)]
pub struct Tree {
    root: Arc<Node>,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Tree {
        Tree { root: Arc::new(Node::Leaf(Vec::new())) }
    }

    /// Builds a tree from objects sorted by key with no duplicate keys.
    pub fn from_sorted(objects: Vec<Arc<Object>>) -> Tree {
        if objects.is_empty() {
            return Tree::new();
        }
        let mut level: Vec<Arc<Node>> = Vec::new();
        let mut it = objects.into_iter();
        for size in chunk_sizes(it.len()) {
            level.push(Arc::new(Node::Leaf(it.by_ref().take(size).collect())));
        }
        while level.len() > 1 {
            let mut next = Vec::new();
            let mut it = level.into_iter();
            for size in chunk_sizes(it.len()) {
                let children: Vec<Arc<Node>> = it.by_ref().take(size).collect();
                next.push(Arc::new(Node::Internal(internal_from_children(children))));
            }
            level = next;
        }
        Tree { root: level.pop().unwrap_or_else(|| Arc::new(Node::Leaf(Vec::new()))) }
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.root.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The object stored under `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Arc<Object>> {
        let mut node = &*self.root;
        loop {
            match node {
                Node::Internal(n) => node = &n.children[n.child_for(key)],
                Node::Leaf(items) => {
                    return items.binary_search_by(|o| o.key().cmp(key)).ok().map(|i| &items[i]);
                }
            }
        }
    }

    /// Inserts or replaces; returns the replaced object.
    pub fn insert(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let (old, split) = insert_rec(&mut self.root, obj);
        if let Some((sep, right)) = split {
            let left = core::mem::replace(&mut self.root, Arc::new(Node::Leaf(Vec::new())));
            let len = left.len() + right.len();
            self.root = Arc::new(Node::Internal(Internal {
                seps: alloc::vec![sep],
                children: alloc::vec![left, right],
                len,
            }));
        }
        old
    }

    /// Removes the object under `key`; returns it.
    pub fn remove(&mut self, key: &[u8]) -> Option<Arc<Object>> {
        let removed = remove_rec(&mut self.root, key);
        self.collapse_root();
        removed
    }

    /// Replaces a root with a single child by that child.
    fn collapse_root(&mut self) {
        loop {
            let only = match &*self.root {
                Node::Internal(n) if n.children.len() == 1 => n.children[0].clone(),
                _ => break,
            };
            self.root = only;
        }
    }

    /// Calls `f` on every object with key ≥ `start`, in key order, until `f` breaks.
    pub fn for_each_from<B>(
        &self,
        start: &[u8],
        mut f: impl FnMut(&Arc<Object>) -> ControlFlow<B>,
    ) -> Option<B> {
        match walk(&self.root, Some(start), &mut f) {
            ControlFlow::Break(b) => Some(b),
            ControlFlow::Continue(()) => None,
        }
    }

    /// Number of keys in `[start, end)` (`end: None` = unbounded), in O(log n).
    pub fn count_range(&self, start: &[u8], end: Option<&[u8]>) -> usize {
        let hi = match end {
            Some(e) => rank(&self.root, e),
            None => self.len(),
        };
        hi.saturating_sub(rank(&self.root, start))
    }

    /// All objects in key order.
    pub fn to_vec(&self) -> Vec<Arc<Object>> {
        let mut out = Vec::with_capacity(self.len());
        let _ = self.for_each_from::<()>(&[], |o| {
            out.push(o.clone());
            ControlFlow::Continue(())
        });
        out
    }

    /// Number of tree nodes (for the memory report).
    pub fn node_count(&self) -> usize {
        fn count(n: &Node) -> usize {
            match n {
                Node::Leaf(_) => 1,
                Node::Internal(i) => 1 + i.children.iter().map(|c| count(c)).sum::<usize>(),
            }
        }
        count(&self.root)
    }

    /// Checks the structural invariants; panics on a violation (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        fn rec(n: &Node, lo: Option<&[u8]>, hi: Option<&[u8]>, root: bool) -> (usize, usize) {
            match n {
                Node::Leaf(items) => {
                    assert!(items.len() <= MAX);
                    assert!(root || items.len() >= MIN, "leaf underfull: {}", items.len());
                    for w in items.windows(2) {
                        assert!(w[0].key() < w[1].key());
                    }
                    for o in items {
                        assert!(lo.is_none_or(|l| o.key() >= l));
                        assert!(hi.is_none_or(|h| o.key() < h));
                    }
                    (items.len(), 1)
                }
                Node::Internal(i) => {
                    assert_eq!(i.seps.len() + 1, i.children.len());
                    assert!(i.children.len() <= MAX);
                    assert!(if root { i.children.len() >= 2 } else { i.children.len() >= MIN });
                    let mut total = 0;
                    let mut depth = None;
                    for (c, child) in i.children.iter().enumerate() {
                        let clo = if c == 0 { lo } else { Some(&*i.seps[c - 1]) };
                        let chi = if c == i.seps.len() { hi } else { Some(&*i.seps[c]) };
                        let (n, d) = rec(child, clo, chi, false);
                        total += n;
                        assert!(depth.is_none_or(|x| x == d), "unbalanced");
                        depth = Some(d);
                    }
                    assert_eq!(total, i.len);
                    (total, depth.unwrap_or(0) + 1)
                }
            }
        }
        rec(&self.root, None, None, true);
    }
}

/// Splits `n` entries into nodes about three-quarters full (room for inserts), every node
/// holding at least `MIN` unless there is only one.
fn chunk_sizes(n: usize) -> Vec<usize> {
    let target = MAX * 3 / 4;
    let mut nodes = n.div_ceil(target).max(1);
    if nodes > 1 && n / nodes < MIN {
        nodes = n.div_ceil(MAX);
    }
    let (base, extra) = (n / nodes, n % nodes);
    (0..nodes).map(|i| base + usize::from(i < extra)).collect()
}

fn internal_from_children(children: Vec<Arc<Node>>) -> Internal {
    let seps =
        children[1..].iter().map(|c| Arc::<[u8]>::from(c.first_key().unwrap_or(&[]))).collect();
    let mut n = Internal { seps, children, len: 0 };
    n.recount();
    n
}

type Split = Option<(Arc<[u8]>, Arc<Node>)>;

fn insert_rec(node: &mut Arc<Node>, obj: Arc<Object>) -> (Option<Arc<Object>>, Split) {
    match Arc::make_mut(node) {
        Node::Leaf(items) => match items.binary_search_by(|o| o.key().cmp(obj.key())) {
            Ok(i) => (Some(core::mem::replace(&mut items[i], obj)), None),
            Err(i) => {
                items.insert(i, obj);
                if items.len() <= MAX {
                    return (None, None);
                }
                let right = items.split_off(items.len() / 2);
                let sep = Arc::<[u8]>::from(right[0].key());
                (None, Some((sep, Arc::new(Node::Leaf(right)))))
            }
        },
        Node::Internal(n) => {
            let i = n.child_for(obj.key());
            let (old, split) = insert_rec(&mut n.children[i], obj);
            if old.is_none() {
                n.len += 1;
            }
            if let Some((sep, right)) = split {
                n.seps.insert(i, sep);
                n.children.insert(i + 1, right);
                if n.children.len() > MAX {
                    let (promoted, right) = split_internal(n);
                    return (old, Some((promoted, Arc::new(Node::Internal(right)))));
                }
            }
            (old, None)
        }
    }
}

/// Splits an overfull internal node in two halves; returns the separator to promote and the
/// right half.
fn split_internal(n: &mut Internal) -> (Arc<[u8]>, Internal) {
    let mid = n.children.len() / 2;
    let right_children = n.children.split_off(mid);
    let mut right_seps = n.seps.split_off(mid - 1);
    let promoted = right_seps.remove(0);
    n.recount();
    let mut right = Internal { seps: right_seps, children: right_children, len: 0 };
    right.recount();
    (promoted, right)
}

fn remove_rec(node: &mut Arc<Node>, key: &[u8]) -> Option<Arc<Object>> {
    // Look before copying: a miss must not copy shared nodes.
    if !contains(node, key) {
        return None;
    }
    match Arc::make_mut(node) {
        Node::Leaf(items) => {
            let i = items.binary_search_by(|o| o.key().cmp(key)).ok()?;
            Some(items.remove(i))
        }
        Node::Internal(n) => {
            let i = n.child_for(key);
            let removed = remove_rec(&mut n.children[i], key)?;
            n.len -= 1;
            if n.children[i].width() < MIN && n.children.len() > 1 {
                rebalance(n, i);
            }
            Some(removed)
        }
    }
}

fn contains(node: &Node, key: &[u8]) -> bool {
    match node {
        Node::Leaf(items) => items.binary_search_by(|o| o.key().cmp(key)).is_ok(),
        Node::Internal(n) => contains(&n.children[n.child_for(key)], key),
    }
}

/// Merges the underfull child `i` with a neighbour, splitting the result again if it is too big.
fn rebalance(n: &mut Internal, i: usize) {
    let (l, r) = if i > 0 { (i - 1, i) } else { (i, i + 1) };
    let right = n.children.remove(r);
    let sep = n.seps.remove(l);
    let right = Arc::try_unwrap(right).unwrap_or_else(|shared| (*shared).clone());
    let left = Arc::make_mut(&mut n.children[l]);
    let overflow: Split = match (left, right) {
        (Node::Leaf(a), Node::Leaf(b)) => {
            a.extend(b);
            if a.len() > MAX {
                let tail = a.split_off(a.len() / 2);
                let sep = Arc::<[u8]>::from(tail[0].key());
                Some((sep, Arc::new(Node::Leaf(tail))))
            } else {
                None
            }
        }
        (Node::Internal(a), Node::Internal(b)) => {
            a.seps.push(sep);
            a.seps.extend(b.seps);
            a.children.extend(b.children);
            a.len += b.len;
            if a.children.len() > MAX {
                let (promoted, right) = split_internal(a);
                Some((promoted, Arc::new(Node::Internal(right))))
            } else {
                None
            }
        }
        // Invariant: siblings are at the same depth, so they are of the same kind.
        _ => None,
    };
    if let Some((sep, node)) = overflow {
        n.seps.insert(l, sep);
        n.children.insert(l + 1, node);
    }
}

fn walk<B>(
    node: &Node,
    start: Option<&[u8]>,
    f: &mut impl FnMut(&Arc<Object>) -> ControlFlow<B>,
) -> ControlFlow<B> {
    match node {
        Node::Leaf(items) => {
            let from = match start {
                Some(s) => items.partition_point(|o| o.key() < s),
                None => 0,
            };
            for o in &items[from..] {
                f(o)?;
            }
            ControlFlow::Continue(())
        }
        Node::Internal(n) => {
            let first = start.map_or(0, |s| n.child_for(s));
            for (i, child) in n.children.iter().enumerate().skip(first) {
                walk(child, if i == first { start } else { None }, f)?;
            }
            ControlFlow::Continue(())
        }
    }
}

/// Number of keys strictly less than `key`.
fn rank(node: &Node, key: &[u8]) -> usize {
    match node {
        Node::Leaf(items) => items.partition_point(|o| o.key().cmp(key) == Ordering::Less),
        Node::Internal(n) => {
            let i = n.child_for(key);
            n.children[..i].iter().map(|c| c.len()).sum::<usize>() + rank(&n.children[i], key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use alloc::format;
    use proptest::prelude::*;

    fn obj(k: &str, rv: u64) -> Arc<Object> {
        Arc::new(Object::new(k.as_bytes(), Some(b"v"), rv))
    }

    fn keys(t: &Tree) -> Vec<Vec<u8>> {
        t.to_vec().iter().map(|o| o.key().to_vec()).collect()
    }

    #[test]
    fn insert_get_remove_many() {
        let mut t = Tree::new();
        for i in 0..2000u64 {
            let k = format!("/k/{:05}", (i * 7919) % 2000);
            assert!(t.insert(obj(&k, i)).is_none());
            t.check();
        }
        assert_eq!(t.len(), 2000);
        for i in 0..2000u64 {
            assert!(t.get(format!("/k/{i:05}").as_bytes()).is_some());
        }
        for i in (0..2000u64).step_by(3) {
            assert!(t.remove(format!("/k/{i:05}").as_bytes()).is_some());
            t.check();
        }
        assert_eq!(t.len(), 2000 - 667);
        assert!(t.remove(b"/k/00000").is_none());
    }

    #[test]
    fn snapshots_are_isolated_and_share_nodes() {
        let mut t = Tree::from_sorted((0..1000).map(|i| obj(&format!("/k/{i:04}"), 1)).collect());
        t.check();
        let snap = t.clone();
        t.insert(obj("/k/0500", 2));
        t.remove(b"/k/0001");
        assert_eq!(snap.get(b"/k/0500").unwrap().rv(), 1);
        assert!(snap.get(b"/k/0001").is_some());
        assert_eq!(t.get(b"/k/0500").unwrap().rv(), 2);
        assert!(t.get(b"/k/0001").is_none());
        // Only the touched paths were copied: most leaves are still shared.
        fn leaves(n: &Arc<Node>, out: &mut Vec<*const Node>) {
            match &**n {
                Node::Leaf(_) => out.push(Arc::as_ptr(n)),
                Node::Internal(i) => i.children.iter().for_each(|c| leaves(c, out)),
            }
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        leaves(&t.root, &mut a);
        leaves(&snap.root, &mut b);
        let shared = a.iter().filter(|p| b.contains(p)).count();
        assert!(shared + 3 >= a.len(), "shared {shared} of {}", a.len());
    }

    #[test]
    fn range_walk_and_count() {
        let t = Tree::from_sorted((0..100).map(|i| obj(&format!("/k/{i:03}"), 1)).collect());
        let mut seen = Vec::new();
        t.for_each_from(b"/k/095", |o| {
            seen.push(o.key().to_vec());
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(seen.len(), 5);
        assert_eq!(t.count_range(b"/k/010", Some(b"/k/020")), 10);
        assert_eq!(t.count_range(b"/k/", None), 100);
        assert_eq!(t.count_range(b"/l", None), 0);
        let stopped = t.for_each_from(b"", |o| {
            if o.key() == b"/k/003" {
                ControlFlow::Break(3)
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(stopped, Some(3));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn behaves_like_btreemap(ops in proptest::collection::vec((any::<bool>(), 0u16..400), 1..1500)) {
            let mut t = Tree::new();
            let mut m = BTreeMap::new();
            let mut snaps: Vec<(Tree, Vec<Vec<u8>>)> = Vec::new();
            for (n, (ins, k)) in ops.into_iter().enumerate() {
                let key = format!("{k:04}");
                if ins {
                    let a = t.insert(obj(&key, n as u64)).map(|o| o.rv());
                    let b = m.insert(key.clone().into_bytes(), n as u64);
                    prop_assert_eq!(a, b);
                } else {
                    let a = t.remove(key.as_bytes()).map(|o| o.rv());
                    let b = m.remove(key.as_bytes());
                    prop_assert_eq!(a, b);
                }
                if n % 97 == 0 {
                    snaps.push((t.clone(), m.keys().cloned().collect()));
                }
            }
            t.check();
            prop_assert_eq!(keys(&t), m.keys().cloned().collect::<Vec<_>>());
            for (s, want) in snaps {
                s.check();
                prop_assert_eq!(keys(&s), want);
            }
            let lo = b"0100".as_slice();
            let hi = b"0300".as_slice();
            prop_assert_eq!(t.count_range(lo, Some(hi)), m.range(lo.to_vec()..hi.to_vec()).count());
        }

        #[test]
        fn bulk_load_is_valid(n in 0usize..3000) {
            let t = Tree::from_sorted((0..n).map(|i| obj(&format!("{i:05}"), 1)).collect());
            t.check();
            prop_assert_eq!(t.len(), n);
        }
    }
}
