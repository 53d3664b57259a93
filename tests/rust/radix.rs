//! The radix tree against a naive model (proptest), and its documented behaviours one by one:
//! eviction order per policy, TTL pins and the pin budget, splits, namespaces.
//!
//! The model is a page-level trie with no runs, no splits, no hashing and no eviction index:
//! a list of cached pages, each with its namespace, its tokens, its parent page and its
//! eviction bookkeeping (hits, priority, last touch or release). It predicts the exact victim
//! order of every policy: the evictable leaf page with the smallest (hits or priority, tick).

use std::collections::{BTreeMap, HashMap, HashSet};

use kvcore::eviction::EvictionPolicy;
use kvcore::radix::{
    InsertResult, MatchResult, Namespace, NodeId, RadixTree, DEFAULT_NAMESPACE, PUBLIC_NAMESPACE,
    ROOT,
};
use kvcore::{KvError, PageId, NULL_PAGE};
use proptest::prelude::*;

const PUB: Namespace = PUBLIC_NAMESPACE;

// ------------------------------------------------------------------------------------------------
// The model
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct MPage {
    ns: Namespace,
    parent: Option<usize>,
    tokens: Vec<u32>,
    page: PageId,
    hits: u64,
    priority: i32,
    /// Last touch or release (a counter, one step per page).
    tick: u64,
}

#[derive(Clone, Debug)]
struct Lock {
    node: NodeId,
    path: Vec<usize>,
    ns: Namespace,
}

#[derive(Clone, Debug, Default)]
struct Model {
    page_size: usize,
    policy: EvictionPolicy,
    /// Arena of cached pages; None once evicted.
    nodes: Vec<Option<MPage>>,
    /// Live locks: the tree node locked and the model path it covers.
    locks: Vec<Lock>,
    /// Pins: end page -> (expiry, creation number).
    pins: BTreeMap<usize, (u64, u64)>,
    next_pin_seq: u64,
    budget: usize,
    tick: u64,
}

impl Model {
    fn new(page_size: usize, policy: EvictionPolicy) -> Self {
        Model {
            page_size,
            policy,
            budget: usize::MAX,
            ..Model::default()
        }
    }

    fn page_mut(&mut self, i: usize) -> &mut MPage {
        self.nodes[i].as_mut().unwrap()
    }

    /// A match or insert used `path`: deepest page first, as the tree touches deepest first.
    fn touch(&mut self, path: &[usize], priority: i32) {
        for &i in path.iter().rev() {
            self.tick += 1;
            let tick = self.tick;
            let p = self.page_mut(i);
            p.tick = tick;
            p.hits += 1;
            p.priority = p.priority.max(priority);
        }
    }

    /// Pages of `path` that are now neither locked nor pinned count as used now (deepest
    /// first). Call after removing a lock or pin covering `path`.
    fn release(&mut self, path: &[usize]) {
        let (locked, covered) = (self.locked(), self.covered());
        for &i in path.iter().rev() {
            if !locked.contains(&i) && !covered.contains(&i) {
                self.tick += 1;
                let tick = self.tick;
                self.page_mut(i).tick = tick;
            }
        }
    }

    fn unlock(&mut self, k: usize) -> NodeId {
        let lock = self.locks.remove(k);
        self.release(&lock.path);
        lock.node
    }

    /// Removes the pin ending at `end`; returns the pages no pin covers any more.
    fn remove_pin(&mut self, end: usize) -> usize {
        let before = self.covered().len();
        self.pins.remove(&end);
        let path = self.path_to(end);
        self.release(&path);
        before - self.covered().len()
    }

    fn live(&self) -> impl Iterator<Item = (usize, &MPage)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    fn path_to(&self, mut i: usize) -> Vec<usize> {
        let mut path = vec![i];
        while let Some(p) = self.nodes[i].as_ref().unwrap().parent {
            path.push(p);
            i = p;
        }
        path.reverse();
        path
    }

    fn is_public(&self, i: usize) -> bool {
        self.nodes[i].as_ref().unwrap().ns == PUB
    }

    /// Longest visible path; ties go to the fewest public pages.
    fn best_path(&self, ns: Namespace, tokens: &[u32]) -> Vec<usize> {
        self.best_path_from(ns, &[], tokens)
    }

    /// Longest visible continuation of `anchor` by `tokens` (the whole path is returned).
    fn best_path_from(&self, ns: Namespace, anchor: &[usize], tokens: &[u32]) -> Vec<usize> {
        let mut full: Vec<u32> = anchor
            .iter()
            .flat_map(|&i| self.nodes[i].as_ref().unwrap().tokens.clone())
            .collect();
        full.extend_from_slice(tokens);
        let mut best = anchor.to_vec();
        let mut path = anchor.to_vec();
        let in_public = anchor.iter().all(|&i| self.is_public(i));
        self.search(
            ns,
            &full,
            anchor.last().copied(),
            in_public,
            &mut path,
            &mut best,
        );
        best
    }

    fn search(
        &self,
        ns: Namespace,
        tokens: &[u32],
        parent: Option<usize>,
        in_public: bool,
        path: &mut Vec<usize>,
        best: &mut Vec<usize>,
    ) {
        let publics = |p: &[usize]| p.iter().filter(|&&i| self.is_public(i)).count();
        if path.len() > best.len() || (path.len() == best.len() && publics(path) < publics(best)) {
            *best = path.clone();
        }
        let ps = self.page_size;
        let pos = path.len();
        if (pos + 1) * ps > tokens.len() {
            return;
        }
        let page = &tokens[pos * ps..(pos + 1) * ps];
        let children: Vec<usize> = self
            .live()
            .filter(|(_, n)| n.parent == parent && n.tokens == page)
            .filter(|(_, n)| n.ns == ns || (in_public && n.ns == PUB))
            .map(|(i, _)| i)
            .collect();
        assert!(children.len() <= 2, "model: ambiguous children");
        for c in children {
            path.push(c);
            self.search(
                ns,
                tokens,
                Some(c),
                in_public && self.is_public(c),
                path,
                best,
            );
            path.pop();
        }
    }

    fn pages_of(&self, path: &[usize]) -> Vec<PageId> {
        path.iter()
            .map(|&i| self.nodes[i].as_ref().unwrap().page)
            .collect()
    }

    fn holds_page(&self, page: PageId) -> bool {
        self.live().any(|(_, n)| n.page == page)
    }

    fn insert(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        pages: &[PageId],
    ) -> Result<(Vec<usize>, usize), KvError> {
        self.insert_from(ns, &[], tokens, pages, None)
    }

    /// Inserts `tokens` continuing `anchor`; returns the whole path and the number of pages of
    /// `tokens` already cached. `extend`: the anchor lock's index, if this is an `extend` that
    /// may append in place.
    fn insert_from(
        &mut self,
        ns: Namespace,
        anchor: &[usize],
        tokens: &[u32],
        pages: &[PageId],
        extend: Option<usize>,
    ) -> Result<(Vec<usize>, usize), KvError> {
        let ps = self.page_size;
        if tokens.len() != pages.len() * ps {
            return Err(KvError::InvalidArgument("lengths".into()));
        }
        let mut path = self.best_path_from(ns, anchor, tokens);
        let existing = path.len() - anchor.len();
        let suffix = &pages[existing..];
        for (i, &p) in suffix.iter().enumerate() {
            if p == NULL_PAGE {
                return Err(KvError::InvalidPage("null".into()));
            }
            if self.holds_page(p) || suffix[..i].contains(&p) {
                return Err(KvError::InvalidArgument("taken".into()));
            }
        }
        // In place: the anchor lock's leaf, of `ns`, locked once, not pinned. The new pages
        // join its node: they share its counters, and the lock covers them.
        let in_place = extend.filter(|&k| {
            let lock = &self.locks[k];
            let Some(&last) = lock.path.last() else {
                return false;
            };
            existing == 0
                && !suffix.is_empty()
                && lock.node != ROOT
                && self.nodes[last].as_ref().unwrap().ns == ns
                && !self.live().any(|(_, c)| c.parent == Some(last))
                && self.locks.iter().filter(|l| l.node == lock.node).count() == 1
                && !self.covered().contains(&last)
        });
        let (hits, priority) = match in_place {
            Some(k) => {
                let last = self.nodes[*self.locks[k].path.last().unwrap()]
                    .as_ref()
                    .unwrap();
                (last.hits, last.priority)
            }
            None => (0, i32::MIN),
        };
        for (k, &p) in suffix.iter().enumerate() {
            let pos = existing + k;
            self.nodes.push(Some(MPage {
                ns,
                parent: path.last().copied(),
                tokens: tokens[pos * ps..(pos + 1) * ps].to_vec(),
                page: p,
                hits,
                priority,
                tick: 0,
            }));
            path.push(self.nodes.len() - 1);
        }
        if let Some(k) = in_place {
            self.locks[k].path = path.clone();
        }
        Ok((path, existing))
    }

    fn covered(&self) -> HashSet<usize> {
        self.pins
            .keys()
            .flat_map(|&end| self.path_to(end))
            .collect()
    }

    fn locked(&self) -> HashSet<usize> {
        self.locks
            .iter()
            .flat_map(|l| l.path.iter().copied())
            .collect()
    }

    /// (evictable, locked, pinned, pin-covered) page counts.
    fn counts(&self) -> (usize, usize, usize, usize) {
        let (locked, covered) = (self.locked(), self.covered());
        let mut c = (0, 0, 0, covered.len());
        for (i, _) in self.live() {
            if locked.contains(&i) {
                c.1 += 1;
            } else if covered.contains(&i) {
                c.2 += 1;
            } else {
                c.0 += 1;
            }
        }
        c
    }

    /// Releases expired pins in (expiry, creation) order, as the tree does.
    fn expire(&mut self, now: u64) -> usize {
        let mut expired: Vec<(u64, u64, usize)> = self
            .pins
            .iter()
            .filter(|(_, &(e, _))| e <= now)
            .map(|(&end, &(e, seq))| (e, seq, end))
            .collect();
        expired.sort_unstable();
        expired
            .iter()
            .map(|&(_, _, end)| self.remove_pin(end))
            .sum()
    }

    fn pin(&mut self, ns: Namespace, tokens: &[u32], ttl: u64, now: u64) -> Result<usize, ()> {
        if ttl == 0 {
            return Err(());
        }
        self.expire(now);
        let path = self.best_path(ns, tokens);
        let Some(&end) = path.last() else {
            return Ok(0);
        };
        let covered = self.covered();
        let new = path.iter().filter(|i| !covered.contains(i)).count();
        if new > self.budget.saturating_sub(covered.len()) {
            return Err(());
        }
        let expiry = now.saturating_add(ttl);
        let seq = self.next_pin_seq;
        let e = self.pins.entry(end).or_insert_with(|| (expiry, seq));
        if e.1 == seq {
            self.next_pin_seq += 1;
        }
        e.0 = e.0.max(expiry);
        Ok(path.len())
    }

    fn unpin(&mut self, ns: Namespace, tokens: &[u32]) -> usize {
        let path = self.best_path(ns, tokens);
        let Some(&end) = path.iter().rev().find(|i| self.pins.contains_key(i)) else {
            return 0;
        };
        self.remove_pin(end)
    }

    /// Checks an eviction's output, page by page in order, and applies it.
    fn evict(&mut self, num_pages: usize, evicted: &[PageId]) -> Result<(), String> {
        self.check_evictions(num_pages, evicted)?;
        let (locked, covered) = (self.locked(), self.covered());
        for &p in evicted {
            let leaves: Vec<usize> = self
                .live()
                .filter(|&(i, _)| !locked.contains(&i) && !covered.contains(&i))
                .filter(|&(i, _)| !self.live().any(|(_, c)| c.parent == Some(i)))
                .map(|(i, _)| i)
                .collect();
            let key = |i: usize| {
                let n = self.nodes[i].as_ref().unwrap();
                (self.policy.key(n.hits, n.priority, n.tick), i)
            };
            let victim = leaves.iter().copied().min_by_key(|&i| key(i));
            let want = victim.map(|i| self.nodes[i].as_ref().unwrap().page);
            if want != Some(p) {
                return Err(format!(
                    "{} evicted page {p}, the model expected {want:?} (leaf keys {:?})",
                    self.policy,
                    leaves.iter().map(|&i| key(i)).collect::<Vec<_>>()
                ));
            }
            self.nodes[victim.unwrap()] = None;
        }
        Ok(())
    }

    /// Checks count, classes and closure of an eviction (without applying it).
    fn check_evictions(&mut self, num_pages: usize, evicted: &[PageId]) -> Result<(), String> {
        let (locked, covered) = (self.locked(), self.covered());
        let by_page: HashMap<PageId, usize> = self.live().map(|(i, n)| (n.page, i)).collect();
        let evictable = self.live().count() - locked.union(&covered).count();
        if evicted.len() != num_pages.min(evictable) {
            return Err(format!(
                "evicted {} pages, expected min({num_pages}, {evictable})",
                evicted.len()
            ));
        }
        let mut gone = HashSet::new();
        for p in evicted {
            let i = *by_page.get(p).ok_or(format!("evicted unknown page {p}"))?;
            if locked.contains(&i) || covered.contains(&i) {
                return Err(format!("evicted locked or pinned page {p}"));
            }
            if !gone.insert(i) {
                return Err(format!("evicted page {p} twice"));
            }
        }
        for (i, n) in self.live() {
            if let Some(p) = n.parent {
                if gone.contains(&p) && !gone.contains(&i) {
                    return Err(format!("evicted the parent of a cached page ({i})"));
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------------
// The random walk
// ------------------------------------------------------------------------------------------------

/// Tokens: a prefix of one of a few shared documents, then a short random tail.
#[derive(Clone, Debug)]
struct Toks {
    doc: usize,
    len: usize,
    tail: Vec<u32>,
}

fn toks() -> impl Strategy<Value = Toks> {
    (0usize..3, 0usize..=12, prop::collection::vec(0u32..2, 0..5))
        .prop_map(|(doc, len, tail)| Toks { doc, len, tail })
}

#[derive(Clone, Debug)]
enum Op {
    Match {
        ns: usize,
        t: Toks,
        lock: bool,
        priority: i32,
    },
    Insert {
        ns: usize,
        t: Toks,
        lock: bool,
        priority: i32,
        reuse_matched: bool,
        corrupt: u8,
    },
    Extend {
        lock: usize,
        ns: usize,
        t: Toks,
        priority: i32,
        corrupt: u8,
    },
    Unlock(usize),
    Evict(usize),
    Pin {
        ns: usize,
        t: Toks,
        ttl: u64,
    },
    Unpin {
        ns: usize,
        t: Toks,
    },
    Advance(u64),
    Budget(usize),
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, toks(), any::<bool>(), -2i32..3)
            .prop_map(|(ns, t, lock, priority)| Op::Match { ns, t, lock, priority }),
        6 => (0usize..3, toks(), any::<bool>(), -2i32..3, any::<bool>(), 0u8..10).prop_map(
            |(ns, t, lock, priority, reuse_matched, corrupt)| Op::Insert {
                ns, t, lock, priority, reuse_matched, corrupt
            }
        ),
        5 => (any::<usize>(), prop_oneof![4 => Just(3usize), 1 => 0usize..3], toks(), -2i32..3, 0u8..10)
            .prop_map(|(lock, ns, t, priority, corrupt)| Op::Extend { lock, ns, t, priority, corrupt }),
        3 => any::<usize>().prop_map(Op::Unlock),
        3 => (0usize..10).prop_map(Op::Evict),
        2 => (0usize..3, toks(), 0u64..6).prop_map(|(ns, t, ttl)| Op::Pin { ns, t, ttl }),
        1 => (0usize..3, toks()).prop_map(|(ns, t)| Op::Unpin { ns, t }),
        2 => (0u64..4).prop_map(Op::Advance),
        1 => prop_oneof![Just(usize::MAX), 0usize..12].prop_map(Op::Budget),
        1 => Just(Op::Expire),
    ]
}

const NAMESPACES: [Namespace; 3] = [DEFAULT_NAMESPACE, 1, PUB];

struct Walk {
    tree: RadixTree,
    model: Model,
    docs: Vec<Vec<u32>>,
    now: u64,
    next_page: PageId,
}

impl Walk {
    fn tokens(&self, t: &Toks) -> Vec<u32> {
        let mut v = self.docs[t.doc][..t.len].to_vec();
        v.extend_from_slice(&t.tail);
        v
    }

    /// Everything observable, for "a failed call changes nothing".
    fn snapshot(&self) -> (Vec<PageId>, [usize; 6]) {
        let mut pages: Vec<PageId> = self.tree.pages().collect();
        pages.sort_unstable();
        let t = &self.tree;
        (
            pages,
            [
                t.num_cached_pages(),
                t.num_evictable_pages(),
                t.num_locked_pages(),
                t.num_pinned_pages(),
                t.num_pin_covered_pages(),
                t.num_pins(),
            ],
        )
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Match {
                ns,
                t,
                lock,
                priority,
            } => {
                let ns = NAMESPACES[*ns];
                let tokens = self.tokens(t);
                self.model.expire(self.now);
                let path = self.model.best_path(ns, &tokens);
                prop_assert_eq!(self.tree.peek_prefix_len(ns, &tokens), path.len());
                let mut out = vec![77];
                let r = self
                    .tree
                    .match_prefix(ns, &tokens, *priority, self.now, &mut out);
                prop_assert_eq!(r.num_pages, path.len());
                prop_assert_eq!(&out[1..], &self.model.pages_of(&path)[..]);
                prop_assert_eq!(out[0], 77, "match must append to out");
                for &i in &path {
                    let page_ns = self.model.nodes[i].as_ref().unwrap().ns;
                    prop_assert!(page_ns == ns || page_ns == PUB, "namespace leak");
                }
                prop_assert_eq!(r.node == ROOT, path.is_empty());
                prop_assert_eq!(self.tree.node_prefix_pages(r.node), Some(path.len()));
                self.model.touch(&path, *priority);
                if *lock {
                    self.tree.lock(r.node).unwrap();
                    self.model.locks.push(Lock {
                        node: r.node,
                        path,
                        ns,
                    });
                }
            }
            Op::Insert {
                ns,
                t,
                lock,
                priority,
                reuse_matched,
                corrupt,
            } => {
                let ns = NAMESPACES[*ns];
                let mut tokens = self.tokens(t);
                let ps = self.model.page_size;
                tokens.truncate(tokens.len() / ps * ps);
                let num_pages = tokens.len() / ps;
                let existing = self.model.best_path(ns, &tokens);
                let mut pages: Vec<PageId> = (0..num_pages as PageId)
                    .map(|k| self.next_page + k)
                    .collect();
                self.next_page += num_pages as PageId;
                if *reuse_matched {
                    let mine = self.model.pages_of(&existing);
                    pages[..mine.len()].copy_from_slice(&mine);
                }
                let suffix = existing.len()..num_pages;
                let mut expect_err = false;
                match corrupt {
                    1 if !suffix.is_empty() => {
                        pages[suffix.end - 1] = NULL_PAGE;
                        expect_err = true;
                    }
                    2 if !suffix.is_empty() => {
                        if let Some((_, n)) = self.model.live().next() {
                            pages[suffix.start] = n.page;
                            expect_err = true;
                        }
                    }
                    3 if suffix.len() >= 2 => {
                        pages[suffix.end - 1] = pages[suffix.start];
                        expect_err = true;
                    }
                    _ => {}
                }
                let before = self.snapshot();
                let got = self.tree.insert(ns, &tokens, &pages, *priority, self.now);
                if expect_err {
                    prop_assert!(got.is_err(), "corrupt insert accepted");
                    prop_assert!(self.model.insert(ns, &tokens, &pages).is_err());
                    prop_assert_eq!(self.snapshot(), before, "failed insert changed state");
                } else {
                    self.model.expire(self.now);
                    let r: InsertResult = got.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let (path, num_existing) = self.model.insert(ns, &tokens, &pages).unwrap();
                    prop_assert_eq!(r.num_existing_pages, num_existing);
                    prop_assert_eq!(r.num_adopted_pages, num_pages - num_existing);
                    prop_assert_eq!(r.adopted(), num_existing..num_pages);
                    prop_assert_eq!(r.node == ROOT, num_pages == 0);
                    prop_assert_eq!(self.tree.node_prefix_pages(r.node), Some(num_pages));
                    self.model.touch(&path, *priority);
                    for &p in &pages[num_existing..] {
                        prop_assert!(self.tree.contains_page(p));
                    }
                    if *lock {
                        self.tree.lock(r.node).unwrap();
                        self.model.locks.push(Lock {
                            node: r.node,
                            path,
                            ns,
                        });
                    }
                }
            }
            Op::Extend {
                lock,
                ns,
                t,
                priority,
                corrupt,
            } => {
                if self.model.locks.is_empty() {
                    return self.check();
                }
                let k = lock % self.model.locks.len();
                let anchor = self.model.locks[k].clone();
                // 3: the lock's own namespace; else any (possibly refused).
                let ns = NAMESPACES.get(*ns).copied().unwrap_or(anchor.ns);
                let ps = self.model.page_size;
                let mut tokens = self.tokens(t);
                tokens.truncate(tokens.len() / ps * ps);
                let num_pages = tokens.len() / ps;
                let mut pages: Vec<PageId> = (0..num_pages as PageId)
                    .map(|k| self.next_page + k)
                    .collect();
                self.next_page += num_pages as PageId;
                let anchor_ns = anchor
                    .path
                    .last()
                    .map_or(PUB, |&i| self.model.nodes[i].as_ref().unwrap().ns);
                let visible = anchor_ns == ns || anchor_ns == PUB;
                let mut expect_err = !visible;
                if visible {
                    let existing = self.model.best_path_from(ns, &anchor.path, &tokens).len()
                        - anchor.path.len();
                    if *corrupt == 1 && existing < num_pages {
                        pages[num_pages - 1] = NULL_PAGE;
                        expect_err = true;
                    }
                }
                let before = self.snapshot();
                let got = self
                    .tree
                    .extend(ns, anchor.node, &tokens, &pages, *priority, self.now);
                if expect_err {
                    prop_assert!(got.is_err(), "bad extend accepted");
                    prop_assert_eq!(self.snapshot(), before, "failed extend changed state");
                } else {
                    self.model.expire(self.now);
                    let r = got.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let (path, num_existing) = self
                        .model
                        .insert_from(ns, &anchor.path, &tokens, &pages, Some(k))
                        .unwrap();
                    prop_assert_eq!(r.num_existing_pages, num_existing);
                    prop_assert_eq!(r.num_adopted_pages, num_pages - num_existing);
                    prop_assert_eq!(self.tree.node_prefix_pages(r.node), Some(path.len()));
                    self.model.touch(&path, *priority);
                    // The caller moves its lock to the new node.
                    self.tree.lock(r.node).unwrap();
                    self.model.locks.push(Lock {
                        node: r.node,
                        path,
                        ns: anchor.ns,
                    });
                    let node = self.model.unlock(k);
                    self.tree.unlock(node).unwrap();
                }
            }
            Op::Unlock(k) => {
                if !self.model.locks.is_empty() {
                    let node = self.model.unlock(k % self.model.locks.len());
                    self.tree.unlock(node).unwrap();
                }
            }
            Op::Evict(n) => {
                self.model.expire(self.now);
                let mut out = Vec::new();
                let got = self.tree.evict(*n, self.now, &mut out);
                prop_assert_eq!(got, out.len());
                self.model.evict(*n, &out).map_err(TestCaseError::fail)?;
                for p in out {
                    prop_assert!(!self.tree.contains_page(p));
                }
            }
            Op::Pin { ns, t, ttl } => {
                let ns = NAMESPACES[*ns];
                let tokens = self.tokens(t);
                let before = self.snapshot();
                let got = self.tree.pin(ns, &tokens, *ttl, self.now);
                let want = self.model.pin(ns, &tokens, *ttl, self.now);
                match (got, want) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                    (Err(KvError::InvalidArgument(_)), Err(())) => {
                        if *ttl == 0 {
                            prop_assert_eq!(self.snapshot(), before);
                        }
                    }
                    (got, want) => prop_assert!(false, "pin: tree {:?}, model {:?}", got, want),
                }
            }
            Op::Unpin { ns, t } => {
                let ns = NAMESPACES[*ns];
                let tokens = self.tokens(t);
                prop_assert_eq!(self.tree.unpin(ns, &tokens), self.model.unpin(ns, &tokens));
            }
            Op::Advance(dt) => self.now += dt,
            Op::Budget(b) => {
                self.tree.set_pin_budget_pages(*b);
                self.model.budget = *b;
            }
            Op::Expire => {
                prop_assert_eq!(self.tree.expire_pins(self.now), self.model.expire(self.now));
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let t = &self.tree;
        self.tree
            .check_invariants()
            .map_err(|e| TestCaseError::fail(format!("invariant: {e}")))?;
        let (evictable, locked, pinned, covered) = self.model.counts();
        prop_assert_eq!(t.num_evictable_pages(), evictable, "evictable");
        prop_assert_eq!(t.num_locked_pages(), locked, "locked");
        prop_assert_eq!(t.num_pinned_pages(), pinned, "pinned");
        prop_assert_eq!(t.num_pin_covered_pages(), covered, "pin-covered");
        prop_assert_eq!(t.num_pins(), self.model.pins.len(), "pins");
        prop_assert_eq!(
            t.num_cached_pages(),
            t.num_evictable_pages() + t.num_locked_pages() + t.num_pinned_pages()
        );
        let mut tree_pages: Vec<PageId> = t.pages().collect();
        let n = tree_pages.len();
        tree_pages.sort_unstable();
        tree_pages.dedup();
        prop_assert_eq!(tree_pages.len(), n, "a page is held twice");
        let mut model_pages: Vec<PageId> = self.model.live().map(|(_, m)| m.page).collect();
        model_pages.sort_unstable();
        prop_assert_eq!(tree_pages, model_pages);
        Ok(())
    }
}

fn run_walk(
    page_size: usize,
    policy: EvictionPolicy,
    collide: bool,
    docs: Vec<Vec<u32>>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut tree = RadixTree::new(page_size, policy).unwrap();
    if collide {
        tree.force_hash_collisions_for_tests().unwrap();
    }
    let mut w = Walk {
        tree,
        model: Model::new(page_size, policy),
        docs,
        now: 1,
        next_page: 1,
    };
    for op in ops {
        w.step(op)?;
    }
    // Drain: unlock everything, drop all pins, evict all.
    for lock in std::mem::take(&mut w.model.locks) {
        w.tree.unlock(lock.node).unwrap();
    }
    w.model.pins.clear();
    w.now = u64::MAX;
    let mut out = Vec::new();
    let cached = w.tree.num_cached_pages();
    prop_assert_eq!(w.tree.evict(usize::MAX, w.now, &mut out), cached);
    prop_assert_eq!(w.tree.num_cached_pages(), 0);
    prop_assert_eq!(w.tree.num_nodes(), 0);
    w.tree.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

/// 384 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(384);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn tree_matches_model(
        page_size in prop_oneof![Just(1usize), Just(2), Just(4)],
        policy in prop_oneof![
            Just(EvictionPolicy::Lru), Just(EvictionPolicy::Lfu), Just(EvictionPolicy::Priority)
        ],
        collide in prop::bool::weighted(0.2),
        docs in prop::collection::vec(prop::collection::vec(0u32..3, 12), 3),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run_walk(page_size, policy, collide, docs, &ops)?;
    }
}

// ------------------------------------------------------------------------------------------------
// Behaviours, one by one
// ------------------------------------------------------------------------------------------------

fn tree(page_size: usize, policy: EvictionPolicy) -> RadixTree {
    RadixTree::new(page_size, policy).unwrap()
}

fn matched(t: &mut RadixTree, ns: Namespace, tokens: &[u32], now: u64) -> (MatchResult, Vec<u32>) {
    let mut out = Vec::new();
    let r = t.match_prefix(ns, tokens, 0, now, &mut out);
    (r, out)
}

/// Evicts one page at a time, returning the order.
fn evict_order(t: &mut RadixTree, now: u64) -> Vec<PageId> {
    let mut order = Vec::new();
    while t.evict(1, now, &mut order) == 1 {}
    t.check_invariants().unwrap();
    order
}

#[test]
fn lru_evicts_least_recently_used_first() {
    let mut t = tree(1, EvictionPolicy::Lru);
    for (i, tok) in [10u32, 20, 30].into_iter().enumerate() {
        t.insert(0, &[tok], &[i as PageId + 1], 0, i as u64)
            .unwrap();
    }
    // Touch 10: it becomes the most recent.
    assert_eq!(matched(&mut t, 0, &[10], 5).1, [1]);
    assert_eq!(evict_order(&mut t, 6), [2, 3, 1]);
}

#[test]
fn lru_evicts_a_chain_leaf_first_and_keeps_parents_in_place() {
    let mut t = tree(1, EvictionPolicy::Lru);
    // A chain 1-2-3 (pages 1,2,3) used at tick 1, then a separate leaf 9 (page 4).
    t.insert(0, &[1, 2, 3], &[1, 2, 3], 0, 1).unwrap();
    t.insert(0, &[9], &[4], 0, 2).unwrap();
    // Split the chain at 1|2-3 by a match on [1], which also makes [1] recent.
    let (r, pages) = matched(&mut t, 0, &[1], 3);
    assert_eq!((r.num_pages, pages), (1, vec![1]));
    // Node [2,3] (untouched since tick 1) goes first, trailing page first; then leaf 9; then
    // the parent [1], touched last.
    assert_eq!(evict_order(&mut t, 4), [3, 2, 4, 1]);
}

#[test]
fn unlocked_nodes_count_as_used_at_release() {
    let mut t = tree(2, EvictionPolicy::Lru);
    let a = t.insert(0, &[1, 1], &[1], 0, 1).unwrap().node;
    t.insert(0, &[2, 2], &[2], 0, 2).unwrap();
    t.lock(a).unwrap();
    assert_eq!(t.num_evictable_pages(), 1);
    t.unlock(a).unwrap();
    assert_eq!(evict_order(&mut t, 3), [2, 1]);
}

#[test]
fn lfu_evicts_fewest_hits_first_lru_among_ties() {
    let mut t = tree(1, EvictionPolicy::Lfu);
    for (i, tok) in [10u32, 20, 30, 40].into_iter().enumerate() {
        t.insert(0, &[tok], &[i as PageId + 1], 0, i as u64)
            .unwrap();
    }
    for tok in [10, 10, 20, 40] {
        matched(&mut t, 0, &[tok], 5);
    }
    // hits: 10 -> 3, 20 -> 2, 30 -> 1, 40 -> 2 (20 touched before 40).
    assert_eq!(evict_order(&mut t, 6), [3, 2, 4, 1]);
}

#[test]
fn lfu_parent_enters_with_its_own_hits() {
    let mut t = tree(1, EvictionPolicy::Lfu);
    t.insert(0, &[1, 2], &[1, 2], 0, 0).unwrap(); // one node [1,2]
                                                  // Splits into [1] -> {[2], [3]}; page 3 is a duplicate of page 1, page 4 is adopted.
    t.insert(0, &[1, 3], &[3, 4], 0, 0).unwrap();
    t.insert(0, &[7], &[5], 0, 0).unwrap();
    for _ in 0..3 {
        matched(&mut t, 0, &[7], 1);
    }
    // [1] has 2 hits (both inserts), [2] 1, [3] 1, [7] 4: leaves [2], [3] go, then [1], then 7.
    assert_eq!(evict_order(&mut t, 2), [2, 4, 1, 5]);
}

#[test]
fn priority_evicts_lowest_priority_first_lru_within_a_level() {
    let mut t = tree(1, EvictionPolicy::Priority);
    t.insert(0, &[1], &[1], 5, 0).unwrap();
    t.insert(0, &[2], &[2], 1, 0).unwrap();
    t.insert(0, &[3], &[3], 3, 0).unwrap();
    t.insert(0, &[4], &[4], 1, 0).unwrap();
    // A match with a higher priority raises a node's priority; a lower one does not lower it.
    let mut out = Vec::new();
    t.match_prefix(0, &[2], 4, 1, &mut out);
    t.match_prefix(0, &[1], -9, 1, &mut out);
    assert_eq!(evict_order(&mut t, 2), [4, 3, 2, 1]);
}

#[test]
fn evict_trims_trailing_pages_of_a_leaf() {
    let mut t = tree(2, EvictionPolicy::Lru);
    t.insert(0, &[1, 1, 2, 2, 3, 3, 4, 4], &[1, 2, 3, 4], 0, 0)
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(t.evict(3, 1, &mut out), 3);
    assert_eq!(out, [4, 3, 2], "trailing page first");
    assert_eq!(t.num_cached_pages(), 1);
    assert_eq!(t.peek_prefix_len(0, &[1, 1, 2, 2]), 1);
    t.check_invariants().unwrap();
    assert_eq!(t.evict(5, 1, &mut out), 1);
    assert_eq!(t.evict(5, 1, &mut out), 0);
    assert_eq!(out, [4, 3, 2, 1]);
}

#[test]
fn evict_skips_locked_and_pinned_pages() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let a = t.insert(0, &[1, 2], &[1, 2], 0, 0).unwrap().node;
    t.insert(0, &[3, 4], &[3, 4], 0, 0).unwrap();
    t.insert(0, &[5], &[5], 0, 0).unwrap();
    t.lock(a).unwrap();
    assert_eq!(t.pin(0, &[3], 100, 0), Ok(1));
    assert_eq!(
        (
            t.num_locked_pages(),
            t.num_pinned_pages(),
            t.num_evictable_pages()
        ),
        (2, 1, 2)
    );
    let mut out = Vec::new();
    assert_eq!(t.evict(10, 1, &mut out), 2);
    out.sort_unstable();
    assert_eq!(out, [4, 5]);
    assert_eq!(t.num_cached_pages(), 3);
}

#[test]
fn ttl_pins_expire_lazily() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.insert(0, &[1, 2, 3], &[1, 2, 3], 0, 0).unwrap();
    assert_eq!(t.pin(0, &[1, 2], 10, 0), Ok(2));
    assert_eq!((t.num_pinned_pages(), t.num_evictable_pages()), (2, 1));
    let mut out = Vec::new();
    assert_eq!(t.evict(3, 9, &mut out), 1, "pin still active at now = 9");
    assert_eq!(out, [3]);
    // Re-pinning extends (never shortens) the expiry.
    assert_eq!(t.pin(0, &[1, 2], 1, 9), Ok(2));
    assert_eq!(t.num_pins(), 1);
    assert_eq!(
        t.num_pinned_pages(),
        2,
        "not released before something takes `now`"
    );
    assert_eq!(t.expire_pins(10), 2);
    assert_eq!((t.num_pinned_pages(), t.num_evictable_pages()), (0, 2));
    assert_eq!(t.num_pins(), 0);
    assert_eq!(t.evict(3, 10, &mut out), 2);
    t.check_invariants().unwrap();
}

#[test]
fn expiry_is_released_by_evict() {
    let mut t = tree(1, EvictionPolicy::Lfu);
    t.insert(0, &[1], &[1], 0, 0).unwrap();
    t.pin(0, &[1], 5, 0).unwrap();
    let mut out = Vec::new();
    assert_eq!(t.evict(1, 4, &mut out), 0);
    assert_eq!(t.evict(1, 5, &mut out), 1);
}

#[test]
fn pin_budget_exhaustion_fails_without_change() {
    let mut t = tree(1, EvictionPolicy::Lru);
    t.set_pin_budget_pages(3);
    t.insert(0, &[1, 2, 3, 4], &[1, 2, 3, 4], 0, 0).unwrap();
    let before = (
        t.num_pinned_pages(),
        t.num_evictable_pages(),
        t.num_nodes(),
        t.num_pins(),
    );
    assert!(matches!(
        t.pin(0, &[1, 2, 3, 4], 10, 0),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(
        (
            t.num_pinned_pages(),
            t.num_evictable_pages(),
            t.num_nodes(),
            t.num_pins()
        ),
        before,
        "a refused pin must not even split"
    );
    assert_eq!(t.pin(0, &[1, 2], 10, 0), Ok(2));
    // Overlapping pins count each page once.
    assert_eq!(t.pin(0, &[1, 2, 3], 10, 0), Ok(3));
    assert_eq!(t.num_pin_covered_pages(), 3);
    assert!(t.pin(0, &[1, 2, 3, 4], 10, 0).is_err());
    assert_eq!(t.pin(0, &[1], 10, 0), Ok(1), "adds no page: fits");
    // Unpin releases the deepest pin on the path only.
    assert_eq!(t.unpin(0, &[1, 2, 3, 4]), 1);
    assert_eq!(t.num_pin_covered_pages(), 2);
    assert_eq!(t.unpin(0, &[1, 2, 3, 4]), 1);
    assert_eq!(t.unpin(0, &[1, 2, 3, 4]), 1);
    assert_eq!(t.unpin(0, &[1, 2, 3, 4]), 0);
    assert_eq!(t.num_pinned_pages(), 0);
    assert!(matches!(
        t.pin(0, &[1], 0, 0),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(
        t.pin(0, &[9], 10, 0),
        Ok(0),
        "nothing cached, nothing pinned"
    );
    t.check_invariants().unwrap();
}

#[test]
fn locked_and_pinned_pages_are_counted_once() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let n = t.insert(0, &[1, 2], &[1, 2], 0, 0).unwrap().node;
    t.pin(0, &[1, 2], 10, 0).unwrap();
    t.lock(n).unwrap();
    assert_eq!(
        (
            t.num_locked_pages(),
            t.num_pinned_pages(),
            t.num_pin_covered_pages()
        ),
        (2, 0, 2)
    );
    t.unlock(n).unwrap();
    assert_eq!((t.num_locked_pages(), t.num_pinned_pages()), (0, 2));
    t.check_invariants().unwrap();
}

#[test]
fn split_keeps_locked_ids_on_the_deeper_part() {
    let mut t = tree(2, EvictionPolicy::Lru);
    let tokens: Vec<u32> = (1..=8).collect();
    let full = t.insert(0, &tokens, &[1, 2, 3, 4], 0, 0).unwrap();
    assert_eq!(full.num_adopted_pages, 4);
    t.lock(full.node).unwrap();
    assert_eq!(t.num_nodes(), 1);
    // A match ending inside the node splits it: the returned node is the upper part.
    let (r, pages) = matched(&mut t, 0, &[1, 2, 3, 4, 9, 9], 1);
    assert_eq!((r.num_pages, pages), (2, vec![1, 2]));
    assert_ne!(r.node, full.node);
    assert_eq!(t.num_nodes(), 2);
    assert_eq!(t.node_prefix_pages(r.node), Some(2));
    assert_eq!(
        t.node_prefix_pages(full.node),
        Some(4),
        "old id: deeper part"
    );
    assert_eq!(
        t.lock_ref(r.node),
        Some(1),
        "the new parent inherits the lock"
    );
    // Inserting a branch below the split point.
    let b = t.insert(0, &[1, 2, 3, 4, 9, 9], &[7, 8, 9], 0, 2).unwrap();
    assert_eq!((b.num_existing_pages, b.num_adopted_pages), (2, 1));
    assert_eq!(matched(&mut t, 0, &[1, 2, 3, 4, 9, 9, 0], 3).1, [1, 2, 9]);
    assert_eq!(matched(&mut t, 0, &tokens, 3).1, [1, 2, 3, 4]);
    t.unlock(full.node).unwrap();
    assert_eq!(t.num_locked_pages(), 0);
    assert_eq!(t.num_evictable_pages(), 5);
    t.check_invariants().unwrap();
    // Inserting a prefix of a cached run splits and returns the exact node.
    let p = t.insert(0, &[1, 2], &[50], 0, 4).unwrap();
    assert_eq!((p.num_existing_pages, p.num_adopted_pages), (1, 0));
    assert_eq!(t.node_prefix_pages(p.node), Some(1));
    assert_eq!(t.num_nodes(), 4);
    t.check_invariants().unwrap();
}

#[test]
fn trailing_partial_page_never_matches() {
    let mut t = tree(4, EvictionPolicy::Lru);
    t.insert(0, &[1, 2, 3, 4, 5, 6, 7, 8], &[1, 2], 0, 0)
        .unwrap();
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 3, 4, 5, 6, 7]), 1);
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 3]), 0);
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]), 2);
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 3, 4, 5, 6, 7, 9]), 1);
    let (r, out) = matched(&mut t, 0, &[], 0);
    assert_eq!(
        (r, out.len()),
        (
            MatchResult {
                node: ROOT,
                num_pages: 0
            },
            0
        )
    );
}

#[test]
fn namespaces_are_isolated_and_public_is_shared() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let (a, b) = (7, 8);
    t.insert(a, &[1, 2, 3], &[1, 2, 3], 0, 0).unwrap();
    assert_eq!(t.peek_prefix_len(a, &[1, 2, 3]), 3);
    assert_eq!(t.peek_prefix_len(b, &[1, 2, 3]), 0);
    assert_eq!(t.peek_prefix_len(DEFAULT_NAMESPACE, &[1, 2, 3]), 0);
    assert_eq!(t.peek_prefix_len(PUB, &[1, 2, 3]), 0);
    // A public system prompt, seen from everyone.
    t.insert(PUB, &[5, 6], &[5, 6], 0, 0).unwrap();
    for ns in [a, b, DEFAULT_NAMESPACE, PUB] {
        assert_eq!(matched(&mut t, ns, &[5, 6, 7], 1).1, [5, 6]);
    }
    // Tenant a continues it: the continuation is a's alone, the prefix stays shared.
    let r = t.insert(a, &[5, 6, 7, 8], &[5, 6, 10, 11], 0, 2).unwrap();
    assert_eq!((r.num_existing_pages, r.num_adopted_pages), (2, 2));
    assert_eq!(matched(&mut t, a, &[5, 6, 7, 8], 3).1, [5, 6, 10, 11]);
    assert_eq!(matched(&mut t, b, &[5, 6, 7, 8], 3).1, [5, 6]);
    assert_eq!(matched(&mut t, PUB, &[5, 6, 7, 8], 3).1, [5, 6]);
    // b's own copy of the same continuation.
    t.insert(b, &[5, 6, 7, 8], &[5, 6, 12, 13], 0, 4).unwrap();
    assert_eq!(matched(&mut t, b, &[5, 6, 7, 8], 5).1, [5, 6, 12, 13]);
    assert_eq!(matched(&mut t, a, &[5, 6, 7, 8], 5).1, [5, 6, 10, 11]);
    // A tie between a's own tree and the public one goes to a's own (fewer public pages).
    t.insert(a, &[20, 21], &[20, 21], 0, 6).unwrap();
    t.insert(PUB, &[20, 21], &[22, 23], 0, 6).unwrap();
    assert_eq!(matched(&mut t, a, &[20, 21], 7).1, [20, 21]);
    assert_eq!(matched(&mut t, b, &[20, 21], 7).1, [22, 23]);
    // The longer one wins otherwise.
    t.insert(PUB, &[20, 21, 22], &[24, 25, 26], 0, 8).unwrap();
    assert_eq!(matched(&mut t, a, &[20, 21, 22], 9).1, [22, 23, 26]);
    t.check_invariants().unwrap();
    // Locking a's private continuation pins the public trunk under it.
    let n = matched(&mut t, a, &[5, 6, 7, 8], 10).0.node;
    t.lock(n).unwrap();
    assert_eq!(t.num_locked_pages(), 4);
    let mut out = Vec::new();
    t.evict(usize::MAX, 11, &mut out);
    assert_eq!(t.num_cached_pages(), 4);
    assert_eq!(matched(&mut t, b, &[5, 6, 7, 8], 12).1, [5, 6]);
    t.check_invariants().unwrap();
}

#[test]
fn insert_reports_existing_and_adopted_pages() {
    let mut t = tree(2, EvictionPolicy::Lru);
    let r = t.insert(0, &[1, 1, 2, 2], &[1, 2], 0, 0).unwrap();
    assert_eq!((r.num_existing_pages, r.num_adopted_pages), (0, 2));
    // Same tokens with other pages: all duplicates, nothing adopted, tree keeps its pages.
    let r = t.insert(0, &[1, 1, 2, 2, 3, 3], &[5, 6, 7], 0, 1).unwrap();
    assert_eq!(r.adopted(), 2..3);
    assert!(!t.contains_page(5) && !t.contains_page(6) && t.contains_page(7));
    assert_eq!(matched(&mut t, 0, &[1, 1, 2, 2, 3, 3], 2).1, [1, 2, 7]);
    let r = t.insert(0, &[], &[], 0, 3).unwrap();
    assert_eq!((r.node, r.num_adopted_pages), (ROOT, 0));
}

#[test]
fn extend_appends_in_place_for_the_only_holder() {
    let mut t = tree(2, EvictionPolicy::Lru);
    let r = t.insert(0, &[1, 1, 2, 2], &[1, 2], 0, 0).unwrap();
    t.lock(r.node).unwrap();
    // The sequence fills a page: it joins the sequence's own node.
    let e = t.extend(0, r.node, &[3, 3], &[3], 0, 1).unwrap();
    assert_eq!((e.node, e.adopted()), (r.node, 0..1));
    t.lock(e.node).unwrap();
    t.unlock(r.node).unwrap();
    assert_eq!(t.num_nodes(), 1);
    assert_eq!((t.num_locked_pages(), t.num_cached_pages()), (3, 3));
    assert_eq!(t.node_prefix_pages(e.node), Some(3));
    assert_eq!(matched(&mut t, 0, &[1, 1, 2, 2, 3, 3], 2).1, [1, 2, 3]);
    // A fork: two holders, so the next page becomes a child, the shared node stays as it is.
    t.lock(e.node).unwrap();
    let a = t.extend(0, e.node, &[4, 4], &[4], 0, 3).unwrap();
    assert_ne!(a.node, e.node);
    t.lock(a.node).unwrap();
    t.unlock(e.node).unwrap();
    assert_eq!(t.node_prefix_pages(e.node), Some(3));
    // The other holder continues differently: a sibling.
    let b = t.extend(0, e.node, &[5, 5], &[5], 0, 4).unwrap();
    assert_ne!(b.node, a.node);
    assert_eq!(t.num_nodes(), 3);
    // A continuation already cached is kept (the caller's page 9 is a duplicate).
    let c = t.extend(0, e.node, &[4, 4, 6, 6], &[9, 6], 0, 5).unwrap();
    assert_eq!((c.num_existing_pages, c.num_adopted_pages), (1, 1));
    assert_eq!(
        matched(&mut t, 0, &[1, 1, 2, 2, 3, 3, 4, 4, 6, 6], 6).1,
        [1, 2, 3, 4, 6]
    );
    // A pinned leaf is never extended in place (the pin would grow past its budget check).
    t.lock(c.node).unwrap();
    t.unlock(a.node).unwrap();
    t.pin(0, &[1, 1, 2, 2, 3, 3, 4, 4, 6, 6], 10, 6).unwrap();
    let d = t.extend(0, c.node, &[7, 7], &[7], 0, 7).unwrap();
    assert_ne!(d.node, c.node);
    // From the root, extend is a plain insert.
    let r2 = t.extend(0, ROOT, &[8, 8], &[8], 0, 8).unwrap();
    assert_eq!(t.node_prefix_pages(r2.node), Some(1));
    t.check_invariants().unwrap();
    // Mistakes: a dead node, another namespace's node, lengths, a page already cached.
    assert!(t.extend(0, 9999, &[1, 1], &[20], 0, 9).is_err());
    assert!(matches!(
        t.extend(5, c.node, &[1, 1], &[20], 0, 9),
        Err(KvError::InvalidArgument(_))
    ));
    assert!(t.extend(0, c.node, &[1, 1, 1], &[20], 0, 9).is_err());
    assert!(t.extend(0, c.node, &[9, 9], &[1], 0, 9).is_err());
    assert!(!t.contains_page(20));
    t.check_invariants().unwrap();
}

#[test]
fn extend_from_a_public_node_stays_private() {
    let mut t = tree(1, EvictionPolicy::Lru);
    let p = t.insert(PUB, &[1, 2], &[1, 2], 0, 0).unwrap().node;
    t.lock(p).unwrap();
    // Public extends a public leaf in place.
    let q = t.extend(PUB, p, &[3], &[3], 0, 1).unwrap();
    assert_eq!(q.node, p);
    // A tenant's continuation of a public node is the tenant's own node.
    let a = t.extend(7, p, &[4], &[4], 0, 2).unwrap();
    assert_ne!(a.node, p);
    assert_eq!(t.peek_prefix_len(7, &[1, 2, 3, 4]), 4);
    assert_eq!(t.peek_prefix_len(7, &[1, 2, 3]), 3);
    assert_eq!(t.peek_prefix_len(8, &[1, 2, 3, 4]), 3);
    t.lock(a.node).unwrap();
    let b = t.extend(7, a.node, &[5], &[5], 0, 3).unwrap();
    assert_eq!(b.node, a.node, "the tenant's own leaf grows in place");
    assert_eq!(t.peek_prefix_len(7, &[1, 2, 3, 4, 5]), 5);
    assert_eq!(t.peek_prefix_len(8, &[1, 2, 3, 4, 5]), 3);
    assert_eq!(t.peek_prefix_len(PUB, &[1, 2, 3, 4, 5]), 3);
    t.check_invariants().unwrap();
}

#[test]
fn caller_mistakes_are_errors_that_change_nothing() {
    assert!(matches!(
        RadixTree::new(0, EvictionPolicy::Lru),
        Err(KvError::InvalidArgument(_))
    ));
    let mut t = tree(2, EvictionPolicy::Lru);
    let n = t.insert(0, &[1, 1], &[1], 0, 0).unwrap().node;
    let bad: [(&[u32], &[PageId]); 4] = [
        (&[1, 1, 2], &[2, 3]),    // lengths disagree
        (&[2, 2], &[NULL_PAGE]),  // the null page
        (&[2, 2], &[1]),          // page already cached
        (&[2, 2, 3, 3], &[4, 4]), // listed twice
    ];
    for (tokens, pages) in bad {
        let before: Vec<_> = t.pages().collect();
        assert!(
            t.insert(0, tokens, pages, 0, 1).is_err(),
            "{tokens:?} {pages:?}"
        );
        assert_eq!(t.pages().collect::<Vec<_>>(), before);
        assert!(!t.contains_page(4));
        t.check_invariants().unwrap();
    }
    assert!(matches!(t.unlock(n), Err(KvError::InvalidArgument(_))));
    assert!(t.lock(12345).is_err());
    assert!(t.unlock(u32::MAX).is_err());
    assert_eq!(t.lock(ROOT), Ok(()));
    assert_eq!(t.unlock(ROOT), Ok(()));
    // A dead id is refused.
    let mut out = Vec::new();
    t.evict(1, 1, &mut out);
    assert!(t.lock(n).is_err());
    assert_eq!(t.lock_ref(n), None);
    t.check_invariants().unwrap();
}

#[test]
fn hash_collisions_are_resolved_by_comparing_tokens() {
    let mut t = tree(2, EvictionPolicy::Lfu);
    t.force_hash_collisions_for_tests().unwrap();
    for (i, first) in [1u32, 2, 3, 4].into_iter().enumerate() {
        let p = 10 * (i as PageId + 1);
        t.insert(0, &[first, 0, 7, 7], &[p, p + 1], 0, 0).unwrap();
    }
    for (i, first) in [1u32, 2, 3, 4].into_iter().enumerate() {
        let p = 10 * (i as PageId + 1);
        assert_eq!(matched(&mut t, 0, &[first, 0, 7, 7], 1).1, [p, p + 1]);
        assert_eq!(matched(&mut t, 0, &[first, 0, 8, 8], 1).1, [p]);
    }
    assert_eq!(t.peek_prefix_len(0, &[5, 0]), 0);
    t.check_invariants().unwrap();
    let mut out = Vec::new();
    assert_eq!(t.evict(8, 2, &mut out), 8);
    t.check_invariants().unwrap();
    assert!(t.force_hash_collisions_for_tests().is_ok(), "empty again");
}

#[test]
fn evict_everything_then_reuse_the_tree() {
    for policy in EvictionPolicy::ALL {
        let mut t = tree(4, policy);
        let mut next: PageId = 1;
        for round in 0..3u32 {
            for s in 0..20u32 {
                let tokens: Vec<u32> = (0..32).map(|k| (s % 5) * 100 + k + round).collect();
                let pages: Vec<PageId> = (next..next + 8).collect();
                let r = t
                    .insert(
                        u64::from(s % 3),
                        &tokens,
                        &pages,
                        s as i32 % 4,
                        u64::from(s),
                    )
                    .unwrap();
                next += 8;
                if s % 4 == 0 {
                    t.lock(r.node).unwrap();
                    t.unlock(r.node).unwrap();
                }
            }
            t.check_invariants().unwrap();
            let cached = t.num_cached_pages();
            let mut out = Vec::new();
            assert_eq!(t.evict(usize::MAX, 100, &mut out), cached);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), cached);
            assert_eq!(t.num_nodes(), 0);
            t.check_invariants().unwrap();
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Timing (run with `cargo test --release --test radix -- --ignored --nocapture`). The machine may
// be shared, so each figure is the min and the median over many timed calls.
// ------------------------------------------------------------------------------------------------

/// (min, median) in ns of `samples` timed calls of `f`, each repeated `inner` times.
fn time_ns(samples: usize, inner: u32, mut f: impl FnMut()) -> (f64, f64) {
    let mut v: Vec<f64> = (0..samples)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..inner {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(inner)
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

#[test]
#[ignore = "timing; run in release"]
fn timing_match() {
    let ps = 16;
    // A 2,048-token prompt whose first 1,920 tokens are cached: as 1 node, as 15 nodes of 8
    // pages (a multi-turn history), and as 120 nodes of 1 page (pages inserted one by one).
    for nodes in [1usize, 15, 120] {
        let mut t = tree(ps, EvictionPolicy::Lru);
        let prompt: Vec<u32> = (0..2048u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 8)
            .collect();
        let pages_per_node = 120 / nodes;
        for k in 1..=nodes {
            let len = k * pages_per_node * ps;
            let pages: Vec<PageId> = (1..=(len / ps) as PageId).collect();
            t.insert(0, &prompt[..len], &pages, 0, 0).unwrap();
        }
        assert_eq!(t.num_nodes(), nodes);
        let mut out = Vec::with_capacity(256);
        let mut now = 1;
        let (min, med) = time_ns(200, 1000, || {
            out.clear();
            now += 1;
            let r = t.match_prefix(0, std::hint::black_box(&prompt), 0, now, &mut out);
            assert_eq!(r.num_pages, 120);
        });
        println!(
            "match_prefix, 2048 tokens, 1920 cached in {nodes:>3} nodes: min {min:.0} ns \
             ({:.3} ns/token), median {med:.0} ns",
            min / 2048.0
        );
        let (min, med) = time_ns(200, 1000, || {
            assert_eq!(t.peek_prefix_len(0, std::hint::black_box(&prompt)), 120);
        });
        println!(
            "peek_prefix_len, same:                        min {min:.0} ns, median {med:.0} ns"
        );
    }
}

#[test]
#[ignore = "timing; run in release"]
fn timing_extend() {
    // A sequence caching its pages as they fill: 128 extends of one 16-token page, each with
    // the caller's lock moved to the returned node.
    let ps = 16;
    let tokens: Vec<u32> = (0..2048u32).collect();
    let mut samples = Vec::new();
    for _ in 0..200 {
        let mut t = tree(ps, EvictionPolicy::Lru);
        let start = std::time::Instant::now();
        let mut node = ROOT;
        for k in 0..128usize {
            let r = t
                .extend(
                    0,
                    node,
                    &tokens[k * ps..(k + 1) * ps],
                    &[k as PageId + 1],
                    0,
                    0,
                )
                .unwrap();
            t.lock(r.node).unwrap();
            t.unlock(node).unwrap();
            node = r.node;
        }
        samples.push(start.elapsed().as_nanos() as f64 / 128.0);
        assert_eq!(t.num_nodes(), 1);
        let mut out = Vec::new();
        assert_eq!(t.match_prefix(0, &tokens, 0, 1, &mut out).num_pages, 128);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "extend + lock + unlock, one page: min {:.0} ns, median {:.0} ns (128 pages -> 1 node)",
        samples[0],
        samples[samples.len() / 2]
    );
}

#[test]
#[ignore = "timing; run in release"]
fn timing_evict() {
    let ps = 16;
    let cases = [
        (EvictionPolicy::Lru, 4usize, 2_000usize),
        (EvictionPolicy::Lru, 1, 5_000),
        (EvictionPolicy::Lru, 1, 100_000),
        (EvictionPolicy::Lfu, 4, 2_000),
        (EvictionPolicy::Priority, 1, 5_000),
        (EvictionPolicy::Priority, 8, 50_000),
    ];
    for (policy, pages_per_leaf, num_nodes) in cases {
        // `num_nodes` leaves under 64 shared first pages, evict(1000) at a time, refill.
        let mut t = tree(ps, policy);
        let mut tokens = vec![0u32; (1 + pages_per_leaf) * ps];
        let mut next: PageId = 1;
        let mut seq = 0u32;
        let mut fill = |t: &mut RadixTree, n: usize| {
            for _ in 0..n {
                tokens[..ps].fill(seq % 64);
                tokens[ps..].fill(seq);
                let num_pages = 1 + pages_per_leaf as PageId;
                let pages: Vec<PageId> = (next..next + num_pages).collect();
                let r = t.insert(0, &tokens, &pages, (seq % 3) as i32, 0).unwrap();
                next += r.num_adopted_pages as PageId;
                seq += 1;
            }
        };
        fill(&mut t, num_nodes);
        let mut out = Vec::with_capacity(1000);
        let mut samples = Vec::new();
        for _ in 0..60 {
            out.clear();
            let start = std::time::Instant::now();
            assert_eq!(t.evict(1000, 1, &mut out), 1000);
            samples.push(start.elapsed().as_nanos() as f64 / 1000.0);
            // Put back as many pages as went, so that the tree keeps its size.
            fill(&mut t, 1000 / pages_per_leaf);
            for p in &out {
                assert!(!t.contains_page(*p));
            }
        }
        samples.sort_by(f64::total_cmp);
        println!(
            "evict(1000), {policy:>8}, {pages_per_leaf}-page leaves, {num_nodes:>6} nodes: min \
             {:.1} us, median {:.1} us",
            samples[0],
            samples[samples.len() / 2]
        );
    }
}
