//! The page-granular, reference-counted radix tree for prefix sharing (F3), partitioned by
//! namespace (F4), with eviction (F5) through [`crate::eviction`].
//!
//! Provenance: SGLang's `RadixCache` (token-id edges aligned to `page_size`, split on a partial
//! match, `lock_ref` up the path, leaf-only eviction, evictable/protected size counters), with
//! TensorRT-LLM's retention priorities and Mooncake's TTL soft pins. What differs:
//! - nodes live in a slab (`Vec` + free list of ids), edges are runs of whole pages, children
//!   are found through one global hash map keyed by `(parent, namespace, hash of the first
//!   page)`, and each hit is confirmed by comparing the page's tokens: one hash per node
//!   boundary, slice comparisons in between;
//! - the eviction order is kept incrementally (no heap over all leaves per call), and the page
//!   counters move at the transitions, so every count is O(1) and exact;
//! - a live sequence caching its pages as they fill extends its own node in place
//!   ([`RadixTree::extend`]) rather than growing a chain of one-page nodes.
//!
//! # Ownership
//! The tree does not own the allocator. It stores page ids and holds, by convention, exactly one
//! reference on every page stored in it: [`RadixTree::insert`] and [`RadixTree::extend`] report
//! which of the caller's pages they adopted (the caller then retains them once for the tree),
//! and [`RadixTree::evict`]
//! returns the pages it dropped (the caller frees them once). A live sequence holds its own
//! reference on every page of its page table, and [`RadixTree::lock`]s its deepest node so that
//! its path is not evicted while it runs.
//!
//! # Namespaces
//! Every node belongs to one namespace. A lookup from namespace `A` follows paths made of
//! [`PUBLIC_NAMESPACE`] nodes from the root, then `A`'s nodes only: the public tree is a shared
//! trunk, and `A`'s own prefixes hang either from the root or from a public node (a tenant's
//! conversation continuing a public system prompt stays private to the tenant). It never enters
//! another namespace's node. Of the candidate paths the longest wins; among equally long ones,
//! the one with the fewest public pages.
//!
//! # Counters
//! Every cached page is in exactly one class, by its node:
//! - **locked**: `lock_ref > 0` (a live sequence uses the node or a descendant);
//! - **pinned**: not locked, and covered by an unexpired pin ([`RadixTree::pin`]);
//! - **evictable**: neither. Locks and pins cover whole root paths, so the evictable nodes are
//!   closed under taking descendants: all of them can be evicted, leaves first.
//!
//! `num_cached_pages == num_evictable_pages + num_locked_pages + num_pinned_pages`.
//!
//! # Node ids
//! A [`NodeId`] is a slab index, valid while its node lives. A node that is locked or pinned
//! lives; an evictable one may be freed (and its id reused) by the next [`RadixTree::evict`].
//! A split keeps the id on the *deeper* part (the part that ends where the node ended) and gives
//! the new, shallower part a new id, so an id held by a locked sequence always names the node
//! that ends where that sequence's cached prefix ends. (The one exception is
//! [`RadixTree::extend`] called with a node the caller does not hold: see there.)

mod check;
mod hash;
#[cfg(test)]
mod tests;

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;

use crate::error::{KvError, KvResult};
use crate::eviction::{EvictKey, EvictionIndex, EvictionPolicy};
use crate::{PageId, NULL_PAGE};
use hash::{child_key, random_seed};
pub(crate) use hash::{hash_page, FxBuildHasher};

/// A node of the tree: a slab index. [`ROOT`] (0) is the one root, shared by every namespace;
/// it holds no pages, and `lock`/`unlock` on it do nothing. A match of zero pages returns it.
pub type NodeId = u32;

/// A partition of the cache (vLLM's `cache_salt`, a tenant). Lookups in one namespace never
/// return pages inserted under another, except [`PUBLIC_NAMESPACE`], visible from all.
pub type Namespace = u64;

/// The namespace of requests that name none.
pub const DEFAULT_NAMESPACE: Namespace = 0;

/// The namespace visible from every namespace (prefixes declared public, e.g. system prompts).
pub const PUBLIC_NAMESPACE: Namespace = u64::MAX;

/// A live node as [`RadixTree::nodes_by_depth`] lists it: `(id, parent, namespace, pages, tokens)`.
pub type NodeView<'a> = (NodeId, NodeId, Namespace, &'a [PageId], &'a [u32]);

/// The root: an empty path, shared by all namespaces. Never evicted, never freed.
pub const ROOT: NodeId = 0;

/// "No node": the end of a collision chain, the root's parent.
const NIL: NodeId = u32::MAX;

/// What [`RadixTree::match_prefix`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchResult {
    /// The node that ends exactly where the match ends ([`ROOT`] when nothing matched); lock it
    /// to keep the matched pages resident.
    pub node: NodeId,
    /// Number of whole pages matched (the pages appended to `out`).
    pub num_pages: usize,
}

/// What [`RadixTree::insert`] or [`RadixTree::extend`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsertResult {
    /// The node that ends exactly where the inserted pages end (for no pages: [`ROOT`] from
    /// `insert`, the given node from `extend`). Lock it to keep the path resident.
    pub node: NodeId,
    /// Leading pages already cached: the tree kept its own pages there, the caller's pages at
    /// those positions were not adopted (duplicates, or the very same pages).
    pub num_existing_pages: usize,
    /// Pages adopted: `pages[num_existing_pages..]`. The caller retains each once (the tree's
    /// reference).
    pub num_adopted_pages: usize,
}

impl InsertResult {
    /// The range of the caller's `pages` that the tree adopted.
    pub fn adopted(&self) -> Range<usize> {
        self.num_existing_pages..self.num_existing_pages + self.num_adopted_pages
    }
}

/// One edge of the tree with the node below it: a run of whole pages.
#[derive(Debug)]
struct Node {
    /// Parent id; `NIL` for the root.
    parent: NodeId,
    /// Next node under the same child-map key (a hash collision), or `NIL`.
    chain_next: NodeId,
    /// Number of children (all namespaces).
    num_children: u32,
    /// Whether the slab slot holds a node (false: on the free list).
    live: bool,
    /// Whether the node is in the eviction index.
    in_index: bool,
    /// Max priority of the inserts and matches that touched the node.
    priority: i32,
    /// Locks on this node or a descendant (live sequences using this path). The root's is 0.
    lock_ref: u64,
    /// Pins ending at this node or a descendant. The root's is 0.
    pin_ref: u32,
    /// Expiry of the pin ending at this node (active while `now < pin_expiry`); 0: none.
    pin_expiry: u64,
    /// Creation number of that pin: pins expiring together are released in creation order.
    pin_seq: u64,
    /// Number of inserts and matches that touched the node (Lfu).
    hits: u64,
    /// Last touch or release, from the tree's strictly increasing tick (recency order).
    tick: u64,
    /// Child-map key: `child_key(parent, ns, hash of the first page)`; 0 for the root.
    key: u64,
    /// Owner namespace.
    ns: Namespace,
    /// Token ids of the edge: `[pages.len() * page_size]` u32. Empty for the root only.
    tokens: Vec<u32>,
    /// Page ids holding those tokens' K/V: `[tokens.len() / page_size]`.
    pages: Vec<PageId>,
}

impl Node {
    fn empty() -> Node {
        Node {
            parent: NIL,
            chain_next: NIL,
            num_children: 0,
            live: false,
            in_index: false,
            priority: i32::MIN,
            lock_ref: 0,
            pin_ref: 0,
            pin_expiry: 0,
            pin_seq: 0,
            hits: 0,
            tick: 0,
            key: 0,
            ns: DEFAULT_NAMESPACE,
            tokens: Vec::new(),
            pages: Vec::new(),
        }
    }

    /// The class of this node's pages (see the module docs, "Counters").
    fn class(&self) -> Class {
        if self.lock_ref > 0 {
            Class::Locked
        } else if self.pin_ref > 0 {
            Class::Pinned
        } else {
            Class::Evictable
        }
    }
}

/// The counter a node's pages are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Evictable,
    Locked,
    Pinned,
}

/// A set of page ids as a bitmap: `[max_page_id / 64 + 1]` u64, grown on demand.
#[derive(Clone, Debug, Default)]
struct PageSet {
    words: Vec<u64>,
}

impl PageSet {
    fn contains(&self, page: PageId) -> bool {
        self.words
            .get(page as usize / 64)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Adds `page`; false if it was already there.
    fn insert(&mut self, page: PageId) -> bool {
        let w = page as usize / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let bit = 1u64 << (page % 64);
        let fresh = self.words[w] & bit == 0;
        self.words[w] |= bit;
        fresh
    }

    fn remove(&mut self, page: PageId) {
        if let Some(w) = self.words.get_mut(page as usize / 64) {
            *w &= !(1u64 << (page % 64));
        }
    }

    fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// Where a lookup ended: `in_node` pages into `node` (its full length when the match covers it),
/// `total` pages from the root.
#[derive(Clone, Copy, Debug)]
struct Found {
    node: NodeId,
    in_node: usize,
    total: usize,
}

/// The radix tree over token ids, holding page ids (see the module docs).
///
/// Single-threaded (`&mut self`); the manager serializes access.
pub struct RadixTree {
    /// Tokens per page, > 0.
    page_size: usize,
    /// Eviction order.
    policy: EvictionPolicy,
    /// The slab: `nodes[ROOT]` is the root; dead slots are on `free_ids`.
    nodes: Vec<Node>,
    /// Dead slab slots, reused first (their vectors keep their capacity).
    free_ids: Vec<NodeId>,
    /// Child map: `child_key(parent, ns, hash of the first page)` -> head of the chain of
    /// nodes with that key. A u64 key keeps buckets at 16 bytes (one cache miss per lookup in
    /// a large tree is the main cost of evicting small nodes).
    children: HashMap<u64, NodeId, FxBuildHasher>,
    /// Every evictable node, in eviction order (the front is always a leaf).
    index: EvictionIndex,
    /// Every page id held by the tree (uniqueness check on insert).
    in_tree: PageSet,
    /// Recency clock: strictly increasing, one step per touch or release.
    tick: u64,
    /// Per-tree random seed of the page hash.
    seed: u64,
    /// ANDed into child-map keys; `u64::MAX` except in collision tests (then 0: one chain).
    hash_mask: u64,
    /// Live nodes of [`PUBLIC_NAMESPACE`]; lookups skip the public trunk while it is 0.
    num_public_nodes: usize,
    /// Live nodes per namespace other than the public one, so that the caller can forget a
    /// namespace's name once nothing of it is cached (entries at zero are removed).
    ns_nodes: HashMap<Namespace, usize>,
    /// Namespaces whose last node was dropped since the last [`take_emptied_namespaces`](Self::take_emptied_namespaces).
    emptied: Vec<Namespace>,
    /// Pages held (sum over live nodes).
    num_cached_pages: usize,
    /// Pages in unlocked, unpinned nodes.
    num_evictable_pages: usize,
    /// Pages in nodes with `lock_ref > 0`.
    num_locked_pages: usize,
    /// Pages in nodes with `pin_ref > 0 && lock_ref == 0`.
    num_pinned_pages: usize,
    /// Most pages that pins may cover.
    pin_budget_pages: usize,
    /// Pages in nodes with `pin_ref > 0`, locked or not (what the budget limits).
    num_pin_covered_pages: usize,
    /// Active pins as `(expiry, creation number, end node)`, soonest first.
    pins: BTreeSet<(u64, u64, NodeId)>,
    /// Creation number of the next pin.
    next_pin_seq: u64,
    /// `pins.first().0`, or `u64::MAX` when there is none: a cheap "anything to expire?".
    next_pin_expiry: u64,
    /// Tenant quotas: `namespace -> (floor, ceiling, cached pages of the namespace)`. Eviction
    /// takes first the pages of a namespace above its ceiling, then those of namespaces above
    /// their floor (or without a quota), and those at or below a floor only when nothing else is
    /// evictable. Empty (the common case): eviction is the index order, and no count is kept.
    floors: HashMap<Namespace, Quota>,
}

/// A namespace's share of a tree (see [`RadixTree::set_floor`], [`RadixTree::set_ceiling`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Cached pages kept while anything else can go (0: none).
    pub floor: usize,
    /// Cached pages beyond which the namespace's pages go first (`usize::MAX`: none).
    pub ceiling: usize,
    /// Cached pages of the namespace now.
    pub cached: usize,
}

impl fmt::Debug for RadixTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadixTree")
            .field("page_size", &self.page_size)
            .field("policy", &self.policy)
            .field("num_nodes", &self.num_nodes())
            .field("num_cached_pages", &self.num_cached_pages)
            .field("num_evictable_pages", &self.num_evictable_pages)
            .field("num_locked_pages", &self.num_locked_pages)
            .field("num_pinned_pages", &self.num_pinned_pages)
            .field("num_pins", &self.pins.len())
            .finish_non_exhaustive()
    }
}

impl RadixTree {
    /// An empty tree of `page_size`-token pages, evicting by `policy`, with an unlimited pin
    /// budget. Err(InvalidArgument) if `page_size` is 0.
    pub fn new(page_size: usize, policy: EvictionPolicy) -> KvResult<Self> {
        if page_size == 0 {
            return Err(KvError::InvalidArgument(
                "page_size must be at least 1".into(),
            ));
        }
        let mut root = Node::empty();
        root.live = true;
        root.ns = PUBLIC_NAMESPACE;
        Ok(RadixTree {
            page_size,
            policy,
            nodes: vec![root],
            free_ids: Vec::new(),
            children: HashMap::default(),
            index: EvictionIndex::new(policy),
            in_tree: PageSet::default(),
            tick: 0,
            seed: random_seed(),
            hash_mask: u64::MAX,
            num_public_nodes: 0,
            ns_nodes: HashMap::new(),
            emptied: Vec::new(),
            num_cached_pages: 0,
            num_evictable_pages: 0,
            num_locked_pages: 0,
            num_pinned_pages: 0,
            pin_budget_pages: usize::MAX,
            num_pin_covered_pages: 0,
            pins: BTreeSet::new(),
            next_pin_seq: 0,
            next_pin_expiry: u64::MAX,
            floors: HashMap::new(),
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    // ---------------------------------------------------------------------------------------
    // Lookup
    // ---------------------------------------------------------------------------------------

    /// Longest cached prefix of `tokens` visible from `ns`, in whole pages (a trailing partial
    /// page never matches; see the module docs for which path wins).
    ///
    /// Appends the matched page ids to `out` (`[num_pages]`, in token order), touches every
    /// node on the path (recency, hit count, `priority` max) and splits the last node if the
    /// match ends inside it, so that the returned node ends exactly at the match. Also releases
    /// pins expired at `now`.
    pub fn match_prefix(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        priority: i32,
        now: u64,
        out: &mut Vec<PageId>,
    ) -> MatchResult {
        self.expire_pins(now);
        let found = self.find(ns, tokens);
        if found.total == 0 {
            return MatchResult {
                node: ROOT,
                num_pages: 0,
            };
        }
        let node = self.split_at(found);
        let start = out.len();
        out.resize(start + found.total, NULL_PAGE);
        let mut end = out.len();
        let mut id = node;
        while id != ROOT {
            let pages = &self.nodes[id as usize].pages;
            out[end - pages.len()..end].copy_from_slice(pages);
            end -= pages.len();
            self.touch(id, priority);
            id = self.nodes[id as usize].parent;
        }
        debug_assert_eq!(end, start);
        MatchResult {
            node,
            num_pages: found.total,
        }
    }

    /// Number of pages [`match_prefix`](Self::match_prefix) would match now (ignoring pin
    /// expiry), without touching or splitting anything.
    pub fn peek_prefix_len(&self, ns: Namespace, tokens: &[u32]) -> usize {
        self.find(ns, tokens).total
    }

    /// [`peek_prefix_len`](Self::peek_prefix_len), and how many of those leading pages public
    /// nodes hold (a path is public pages from the root, then one namespace's): one lookup and a
    /// walk of the found path's nodes, not of its pages.
    pub fn peek_prefix_public(&self, ns: Namespace, tokens: &[u32]) -> (usize, usize) {
        let found = self.find(ns, tokens);
        let total = found.total;
        let mut public = 0;
        self.each_matched(found, |n, matched| {
            if n.ns == PUBLIC_NAMESPACE {
                public += matched;
            }
        });
        (total, public)
    }

    /// [`peek_len_from`](Self::peek_len_from), and how many of the pages found below `node`
    /// public nodes hold. A lookup below `node` and a walk of the nodes it found.
    pub fn peek_from_public(
        &self,
        ns: Namespace,
        node: NodeId,
        tokens: &[u32],
    ) -> KvResult<(usize, usize)> {
        self.check_node(node)?;
        let found = self.find_from(ns, node, tokens);
        let (mut left, mut public) = (found.total, 0);
        let (mut id, mut matched) = (found.node, found.in_node);
        while left > 0 && id != node && id != ROOT {
            let n = &self.nodes[id as usize];
            let m = matched.min(left);
            if n.ns == PUBLIC_NAMESPACE {
                public += m;
            }
            left -= m;
            id = n.parent;
            matched = self.nodes[id as usize].pages.len();
        }
        Ok((found.total, public))
    }

    /// Pages of `tokens` cached below `node` (continuing its path), as [`extend`](Self::extend)
    /// would find them, without touching anything. Err(InvalidArgument) if `node` is not live.
    pub fn peek_len_from(&self, ns: Namespace, node: NodeId, tokens: &[u32]) -> KvResult<usize> {
        self.check_node(node)?;
        Ok(self.find_from(ns, node, tokens).total)
    }

    /// [`peek_len_from`](Self::peek_len_from), `ns`'s own pages only, as
    /// [`extend_own`](Self::extend_own) would find them (a public path below `node` is not
    /// continued for a tenant).
    pub fn peek_own_len_from(
        &self,
        ns: Namespace,
        node: NodeId,
        tokens: &[u32],
    ) -> KvResult<usize> {
        self.check_node(node)?;
        Ok(self.find_own(ns, node, tokens).total)
    }

    /// The longest cached prefix of `tokens` visible from `ns`, as [`match_prefix`](Self::match_prefix)
    /// finds it, without touching, splitting or expiring anything: appends its page ids to `out`
    /// (in token order) and returns their number.
    pub fn peek_prefix_pages(&self, ns: Namespace, tokens: &[u32], out: &mut Vec<PageId>) -> usize {
        let found = self.find(ns, tokens);
        let start = out.len();
        out.resize(start + found.total, NULL_PAGE);
        let mut end = out.len();
        self.each_matched(found, |n, matched| {
            out[end - matched..end].copy_from_slice(&n.pages[..matched]);
            end -= matched;
        });
        debug_assert_eq!(end, start);
        found.total
    }

    /// [`peek_prefix_pages`](Self::peek_prefix_pages), each page with the namespace of the node
    /// holding it (a match from `ns` may run through public nodes).
    pub fn peek_prefix_pages_ns(
        &self,
        ns: Namespace,
        tokens: &[u32],
        out: &mut Vec<(PageId, Namespace)>,
    ) -> usize {
        let found = self.find(ns, tokens);
        let start = out.len();
        out.resize(start + found.total, (NULL_PAGE, ns));
        let mut end = out.len();
        self.each_matched(found, |n, matched| {
            for (dst, &p) in out[end - matched..end].iter_mut().zip(&n.pages[..matched]) {
                *dst = (p, n.ns);
            }
            end -= matched;
        });
        debug_assert_eq!(end, start);
        found.total
    }

    /// [`peek_prefix_len`](Self::peek_prefix_len), and how many of the matched pages are
    /// evictable now: the pages that locking the match would take out of
    /// [`num_evictable_pages`](Self::num_evictable_pages). No side effects.
    pub fn peek_prefix(&self, ns: Namespace, tokens: &[u32]) -> (usize, usize) {
        let found = self.find(ns, tokens);
        let mut evictable = 0;
        self.each_matched(found, |n, matched| {
            if n.class() == Class::Evictable {
                evictable += matched;
            }
        });
        (found.total, evictable)
    }

    /// Calls `f(node, matched pages of it)` on each node of a match, from its last node up to the
    /// root's child (the match may end inside its last node; it covers the others whole).
    fn each_matched(&self, found: Found, mut f: impl FnMut(&Node, usize)) {
        let mut matched = found.in_node;
        let mut id = found.node;
        while id != ROOT {
            let n = &self.nodes[id as usize];
            f(n, matched);
            id = n.parent;
            matched = self.nodes[id as usize].pages.len();
        }
    }

    // ---------------------------------------------------------------------------------------
    // Insert
    // ---------------------------------------------------------------------------------------

    /// Caches `tokens` (`[pages.len() * page_size]`) with their K/V in `pages` under `ns`.
    ///
    /// Walks the path [`match_prefix`](Self::match_prefix) would take: where pages are already
    /// cached the tree keeps its own; the rest (`pages[num_existing_pages..]`) are adopted as
    /// one new node (the caller retains each once for the tree). Touches the path with
    /// `priority` and splits a node if the inserted tokens end inside it. Releases pins expired
    /// at `now`.
    ///
    /// Errors (nothing changed): `InvalidArgument` if the lengths disagree, or if a page to
    /// adopt is already held by the tree or listed twice; `InvalidPage` for the null page.
    pub fn insert(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        pages: &[PageId],
        priority: i32,
        now: u64,
    ) -> KvResult<InsertResult> {
        self.insert_below("insert", ns, ROOT, tokens, pages, priority, now)
    }

    /// Caches the next full pages of a live sequence: `tokens` (`[pages.len() * page_size]`)
    /// continue the path of `node`, the node the sequence holds locked; O(pages added) where
    /// [`insert`](Self::insert) would walk the whole path again.
    ///
    /// Same as `insert` otherwise (the continuation follows the visibility rules from `node`;
    /// cached pages are kept, the others adopted), with one difference: when `node` is a leaf
    /// of `ns` locked once (by the caller) and not pinned, the adopted pages are appended *to
    /// `node` itself*, which then ends at the new pages and is returned. A sequence caching its
    /// pages as they fill thus keeps one long node instead of a chain of one-page nodes (each
    /// node costs a hash probe to match through and a map removal to evict). The appended
    /// pages share the node's hit count and priority. The caller then locks the returned node
    /// and unlocks `node` as usual (a no-op pair when they are the same). If the caller does
    /// not in fact hold the lock on `node`, the holder's lock covers the appended pages too
    /// (they are protected a little longer; nothing is miscounted).
    ///
    /// Errors (nothing changed): those of `insert`, and `InvalidArgument` if `node` is not live
    /// or belongs to another namespace than `ns` (the root and public nodes are fine).
    pub fn extend(
        &mut self,
        ns: Namespace,
        node: NodeId,
        tokens: &[u32],
        pages: &[PageId],
        priority: i32,
        now: u64,
    ) -> KvResult<InsertResult> {
        self.insert_below("extend", ns, node, tokens, pages, priority, now)
    }

    /// [`extend`](Self::extend), but a namespace's own pages only: a public path below `node` is
    /// not continued (for `ns` other than [`PUBLIC_NAMESPACE`]), so a namespace's own copy of
    /// tokens that are public too is added beside the public copy (what caching it before the
    /// public one existed made), not found as the public copy. For re-indexing pages keyed in
    /// `ns`'s chain (a lower tier's restore), whose caller holds no lock on `node`: new pages
    /// always go in a new child, never into `node` itself (whatever locks it is another holder's).
    pub fn extend_own(
        &mut self,
        ns: Namespace,
        node: NodeId,
        tokens: &[u32],
        pages: &[PageId],
        priority: i32,
        now: u64,
    ) -> KvResult<InsertResult> {
        self.insert_below("extend_own", ns, node, tokens, pages, priority, now)
    }

    /// `insert` (from the root) and `extend` (from `node`); `op` names the call in errors.
    #[allow(clippy::too_many_arguments)]
    fn insert_below(
        &mut self,
        op: &str,
        ns: Namespace,
        node: NodeId,
        tokens: &[u32],
        pages: &[PageId],
        priority: i32,
        now: u64,
    ) -> KvResult<InsertResult> {
        self.check_node(node)?;
        let node_ns = self.nodes[node as usize].ns;
        if node_ns != ns && node_ns != PUBLIC_NAMESPACE {
            return Err(KvError::InvalidArgument(format!(
                "{op}: node {node} belongs to namespace {node_ns}, not {ns}"
            )));
        }
        if Some(tokens.len()) != pages.len().checked_mul(self.page_size) {
            return Err(KvError::InvalidArgument(format!(
                "{op}: {} tokens for {} pages of {} tokens",
                tokens.len(),
                pages.len(),
                self.page_size
            )));
        }
        // `extend_own`: the namespace's own pages only, and never in place (its caller holds no
        // lock on `node`).
        let own = op == "extend_own";
        let found = if own {
            self.find_own(ns, node, tokens)
        } else {
            self.find_from(ns, node, tokens)
        };
        let suffix = &pages[found.total..];
        self.claim_pages(op, suffix)?;
        // Validated; from here on nothing fails.
        self.expire_pins(now);
        let mut end = self.split_at(found);
        if !suffix.is_empty() {
            let cut = found.total * self.page_size;
            let n = &self.nodes[end as usize];
            // In place (see `extend`): only a leaf of `ns` locked once (by the caller) and not
            // pinned. Never the root, so never from `insert`; never from `extend_own`, whose
            // caller (a restore) holds no lock: the one lock there is another holder's (a store or
            // load in flight), which must find its node still ending where it did.
            if end == node
                && !own
                && node != ROOT
                && n.num_children == 0
                && n.ns == ns
                && n.lock_ref == 1
                && n.pin_ref == 0
            {
                let n = &mut self.nodes[node as usize];
                n.tokens.extend_from_slice(&tokens[cut..]);
                n.pages.extend_from_slice(suffix);
                self.num_locked_pages += suffix.len();
                self.num_cached_pages += suffix.len();
                self.floor_count(ns, suffix.len() as isize);
            } else {
                end = self.add_child(end, ns, &tokens[cut..], suffix);
            }
        }
        let mut id = end;
        while id != ROOT {
            self.touch(id, priority);
            id = self.nodes[id as usize].parent;
        }
        Ok(InsertResult {
            node: end,
            num_existing_pages: found.total,
            num_adopted_pages: suffix.len(),
        })
    }

    /// Marks `pages` as held by the tree, or fails with nothing marked.
    fn claim_pages(&mut self, op: &str, pages: &[PageId]) -> KvResult<()> {
        for (i, &page) in pages.iter().enumerate() {
            let err = if page == NULL_PAGE {
                Some(KvError::InvalidPage(format!(
                    "{op}: the null page cannot be cached"
                )))
            } else if !self.in_tree.insert(page) {
                Some(KvError::InvalidArgument(if pages[..i].contains(&page) {
                    format!("{op}: page {page} listed twice")
                } else {
                    format!("{op}: page {page} is already cached")
                }))
            } else {
                None
            };
            if let Some(err) = err {
                for &p in &pages[..i] {
                    self.in_tree.remove(p);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// Swaps in the caller's own copies of cached pages: on the path of `node` (which ends
    /// `end_pages` pages from the root), the page at each position `first + i` becomes
    /// `pages[i]`, in every node that only the caller's one lock on `node` holds (`lock_ref ==
    /// 1`) and no pin covers, and that belongs to the caller's namespace `ns` (a public node, or
    /// another tenant's, keeps its own page). Positions already holding the caller's page, or
    /// whose page is elsewhere in the tree, are left. Returns the `(position, old, new)` of each swap: the tree
    /// now holds `new` instead of `old` (the caller moves the tree's reference). Keys, counts,
    /// recency and the eviction index do not change: the same tokens, the same number of pages.
    ///
    /// For a sequence that recomputed pages the tree already had (a fully cached page-aligned
    /// prompt recomputes its last page): once its copies are computed, the tree takes them and
    /// lets its own go, so that nothing is held for a sequence that does not use it.
    ///
    /// Errors (nothing changed): `InvalidArgument` if `node` is not live or the positions run
    /// past `end_pages`.
    pub fn adopt_copies(
        &mut self,
        node: NodeId,
        ns: Namespace,
        end_pages: usize,
        first: usize,
        pages: &[PageId],
    ) -> KvResult<Vec<(usize, PageId, PageId)>> {
        self.check_node(node)?;
        if first + pages.len() > end_pages {
            return Err(KvError::InvalidArgument(format!(
                "adopt_copies: positions {first}..{} past the node's {end_pages} pages",
                first + pages.len()
            )));
        }
        let mut swapped = Vec::new();
        let (mut id, mut end) = (node, end_pages);
        while id != ROOT && end > first {
            let n = &self.nodes[id as usize];
            let start = end.saturating_sub(n.pages.len());
            // Only a node of the sequence's own namespace takes its copies: a page another
            // tenant computed never enters a public node (nor another tenant's).
            let (parent, lone) = (n.parent, n.lock_ref == 1 && n.pin_ref == 0 && n.ns == ns);
            if lone {
                for pos in start.max(first)..end.min(first + pages.len()) {
                    let (old, new) = (
                        self.nodes[id as usize].pages[pos - start],
                        pages[pos - first],
                    );
                    if old != new && new != crate::NULL_PAGE && !self.in_tree.contains(new) {
                        self.nodes[id as usize].pages[pos - start] = new;
                        self.in_tree.remove(old);
                        self.in_tree.insert(new);
                        swapped.push((pos, old, new));
                    }
                }
            }
            (id, end) = (parent, start);
        }
        Ok(swapped)
    }

    // ---------------------------------------------------------------------------------------
    // Locks
    // ---------------------------------------------------------------------------------------

    /// Adds a lock on `node` and each of its ancestors (a live sequence pins its path): their
    /// pages become locked and leave the eviction index. No-op on [`ROOT`].
    /// Err(InvalidArgument) if `node` is not a live node.
    pub fn lock(&mut self, node: NodeId) -> KvResult<()> {
        self.check_node(node)?;
        let mut id = node;
        while id != ROOT {
            let n = &mut self.nodes[id as usize];
            n.lock_ref += 1;
            if n.lock_ref == 1 {
                let from = n.class_without_lock();
                let num = n.pages.len();
                self.leave_index(id);
                self.shift(from, Class::Locked, num);
            }
            id = self.nodes[id as usize].parent;
        }
        Ok(())
    }

    /// Removes a lock taken by [`lock`](Self::lock). A node whose last lock goes becomes pinned
    /// (if a pin covers it) or evictable (as if used now). No-op on [`ROOT`].
    /// Err(InvalidArgument) if `node` is not live or not locked.
    pub fn unlock(&mut self, node: NodeId) -> KvResult<()> {
        self.check_node(node)?;
        if node != ROOT && self.nodes[node as usize].lock_ref == 0 {
            return Err(KvError::InvalidArgument(format!(
                "unlock: node {node} is not locked"
            )));
        }
        let mut id = node;
        while id != ROOT {
            let n = &mut self.nodes[id as usize];
            debug_assert!(n.lock_ref > 0, "an ancestor has fewer locks than its child");
            n.lock_ref -= 1;
            if n.lock_ref == 0 {
                let to = n.class();
                let num = n.pages.len();
                self.shift(Class::Locked, to, num);
                if to == Class::Evictable {
                    self.release(id);
                }
            }
            id = self.nodes[id as usize].parent;
        }
        Ok(())
    }

    /// Uses of `node` (matches and inserts through it), or None if `node` is not live.
    pub fn node_hits(&self, node: NodeId) -> Option<u64> {
        self.live_node(node).map(|n| n.hits)
    }

    /// Number of locks on `node` or its descendants, or None if `node` is not live.
    pub fn lock_ref(&self, node: NodeId) -> Option<u64> {
        self.live_node(node).map(|n| n.lock_ref)
    }

    // ---------------------------------------------------------------------------------------
    // Eviction
    // ---------------------------------------------------------------------------------------

    /// Evicts `min(num_pages, evictable)` pages in policy order, appending their ids to `out`
    /// in eviction order (a node's trailing page first; the caller frees each once), and
    /// returns that count. Releases pins expired at `now` first.
    ///
    /// Only evictable leaves go; when a leaf has more pages than still needed its trailing pages
    /// are trimmed and the rest stays. A parent becomes a candidate when its last child goes.
    /// Never evicts a locked or pinned page.
    pub fn evict(&mut self, num_pages: usize, now: u64, out: &mut Vec<PageId>) -> usize {
        self.expire_pins(now);
        let mut remaining = num_pages;
        while remaining > 0 {
            let (victim, limit) = if self.floors.is_empty() {
                match self.index.peek() {
                    Some(v) => (v, usize::MAX),
                    None => break,
                }
            } else {
                match self.floor_victim() {
                    Some(v) => v,
                    None => break,
                }
            };
            let n = &self.nodes[victim as usize];
            debug_assert!(n.num_children == 0 && n.class() == Class::Evictable);
            let len = n.pages.len();
            let take = remaining.min(limit);
            if len > take {
                self.trim_leaf(victim, len - take, out);
                remaining -= take;
                continue;
            }
            let parent = n.parent;
            self.leave_index(victim);
            self.nodes[parent as usize].num_children -= 1;
            self.drop_node(victim, out);
            remaining -= len;
        }
        debug_assert!(remaining == 0 || self.num_evictable_pages == 0);
        num_pages - remaining
    }

    /// Drops the pages of `tokens`' match (visible from `ns`) from its page `from` on, when they
    /// all sit in the match's deepest node and that node is an evictable leaf (no child, lock or
    /// pin); the pages after the match in that node go too. Returns the pages dropped, deepest
    /// first (the caller frees each), or None (nothing changed). A lower tier drops so the copy of
    /// a page whose load failed: a later store, or a lookup that finds it, can put it back.
    pub fn drop_leaf_from(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        from: usize,
    ) -> Option<Vec<PageId>> {
        let found = self.find(ns, tokens);
        let v = found.node;
        if found.total <= from || v == ROOT {
            return None;
        }
        let n = &self.nodes[v as usize];
        let start = found.total - found.in_node; // pages of the path before `v`
        if from < start || n.num_children != 0 || n.class() != Class::Evictable {
            return None;
        }
        let mut out = Vec::new();
        if from == start {
            let parent = n.parent;
            self.leave_index(v);
            self.nodes[parent as usize].num_children -= 1;
            self.drop_node(v, &mut out);
        } else {
            self.trim_leaf(v, from - start, &mut out);
        }
        Some(out)
    }

    /// The next victim with quotas, with the pages it may give: the first leaf in eviction order
    /// whose namespace is above its ceiling (down to it), else the first whose namespace is above
    /// its floor or has no quota (down to the floor), else the index's front (nothing else is
    /// evictable: a floor yields only then).
    fn floor_victim(&self) -> Option<(NodeId, usize)> {
        let front = self.index.peek()?;
        // Some namespace is over its ceiling now: look for its leaves past the first candidate.
        let over = self.floors.values().any(|q| q.cached > q.ceiling);
        let mut second = None;
        for id in self.index.iter() {
            let n = &self.nodes[id as usize];
            if n.num_children != 0 {
                continue;
            }
            match self.floors.get(&n.ns) {
                None => {
                    if second.is_none() {
                        second = Some((id, usize::MAX));
                    }
                }
                Some(q) if q.cached > q.ceiling => return Some((id, q.cached - q.ceiling)),
                Some(q) if q.cached > q.floor && second.is_none() => {
                    second = Some((id, q.cached - q.floor));
                }
                Some(_) => {}
            }
            if second.is_some() && !over {
                break;
            }
        }
        second.or(Some((front, usize::MAX)))
    }

    /// Keep the cached-page count of a namespace with a quota (a no-op without quotas).
    #[inline]
    fn floor_count(&mut self, ns: Namespace, delta: isize) {
        if !self.floors.is_empty() {
            if let Some(q) = self.floors.get_mut(&ns) {
                q.cached = q.cached.wrapping_add_signed(delta);
            }
        }
    }

    fn set_quota(&mut self, ns: Namespace, f: impl FnOnce(&mut Quota)) -> KvResult<()> {
        if ns == PUBLIC_NAMESPACE {
            return Err(KvError::InvalidArgument(
                "the public namespace has no quota (it is every tenant's)".into(),
            ));
        }
        let cached = match self.floors.get(&ns) {
            Some(q) => q.cached,
            None => self.namespace_cached_pages(ns),
        };
        let mut q = self.floors.get(&ns).copied().unwrap_or(Quota {
            floor: 0,
            ceiling: usize::MAX,
            cached,
        });
        f(&mut q);
        if q.floor == 0 && q.ceiling == usize::MAX {
            self.floors.remove(&ns);
        } else {
            self.floors.insert(ns, q);
        }
        Ok(())
    }

    /// Set namespace `ns`'s floor to `pages` cached pages (0 removes it): its pages are evicted
    /// only when no page of another namespace (or of its own above the floor) is evictable. The
    /// public namespace has no quota (InvalidArgument).
    pub fn set_floor(&mut self, ns: Namespace, pages: usize) -> KvResult<()> {
        self.set_quota(ns, |q| q.floor = pages)
    }

    /// Set namespace `ns`'s ceiling to `pages` cached pages (None removes it): past it, its pages
    /// are evicted before any other namespace's. The public namespace has no quota.
    pub fn set_ceiling(&mut self, ns: Namespace, pages: Option<usize>) -> KvResult<()> {
        self.set_quota(ns, |q| q.ceiling = pages.unwrap_or(usize::MAX))
    }

    /// `(floor, cached pages)` of `ns` if it has a floor.
    pub fn floor(&self, ns: Namespace) -> Option<(usize, usize)> {
        self.floors
            .get(&ns)
            .filter(|q| q.floor > 0)
            .map(|q| (q.floor, q.cached))
    }

    /// The quota of `ns`, if it has one.
    pub fn quota(&self, ns: Namespace) -> Option<Quota> {
        self.floors.get(&ns).copied()
    }

    /// Cached pages of `ns` (any class), counted over the live nodes: O(nodes).
    pub fn namespace_cached_pages(&self, ns: Namespace) -> usize {
        self.nodes
            .iter()
            .enumerate()
            .filter(|&(i, n)| i as NodeId != ROOT && n.live && n.ns == ns)
            .map(|(_, n)| n.pages.len())
            .sum()
    }

    /// Frees node `v`, already out of the index and of its parent's child count.
    fn drop_node(&mut self, v: NodeId, out: &mut Vec<PageId>) {
        let n = &self.nodes[v as usize];
        for &p in &n.pages {
            self.in_tree.remove(p);
        }
        out.extend(n.pages.iter().rev());
        let num = n.pages.len();
        let ns = n.ns;
        self.uncount_node(ns);
        self.floor_count(ns, -(num as isize));
        self.num_evictable_pages -= num;
        self.num_cached_pages -= num;
        self.unlink_child(v);
        self.free_node(v);
    }

    /// Keeps the first `keep` (>= 1) pages of the evictable leaf `v`, evicting the others.
    fn trim_leaf(&mut self, v: NodeId, keep: usize, out: &mut Vec<PageId>) {
        let page_size = self.page_size;
        let n = &mut self.nodes[v as usize];
        debug_assert!(keep >= 1 && keep < n.pages.len());
        for &p in &n.pages[keep..] {
            self.in_tree.remove(p);
        }
        out.extend(n.pages[keep..].iter().rev());
        let num = n.pages.len() - keep;
        let ns = n.ns;
        n.pages.truncate(keep);
        n.tokens.truncate(keep * page_size);
        self.floor_count(ns, -(num as isize));
        self.num_evictable_pages -= num;
        self.num_cached_pages -= num;
    }

    // ---------------------------------------------------------------------------------------
    // Pins
    // ---------------------------------------------------------------------------------------

    /// Pins the cached prefix of `tokens` visible from `ns` (the path
    /// [`match_prefix`](Self::match_prefix) would take, split at its end) until `now + ttl`:
    /// while a pin is active its pages are not evictable. Returns the number of pages pinned
    /// (0 if nothing is cached; no pin is made then).
    ///
    /// Pinning a prefix that already ends a pin extends that pin's expiry to the later of the
    /// two. Pins expired at `now` are released first (housekeeping: they were already dead).
    /// Errors (nothing changed): `InvalidArgument` if `ttl == 0`, or if the pages that would
    /// newly be covered by pins do not fit in the pin budget.
    pub fn pin(&mut self, ns: Namespace, tokens: &[u32], ttl: u64, now: u64) -> KvResult<usize> {
        if ttl == 0 {
            return Err(KvError::InvalidArgument("pin: ttl must be > 0".into()));
        }
        self.expire_pins(now);
        let found = self.find(ns, tokens);
        if found.total == 0 {
            return Ok(0);
        }
        let new_pages = self.uncovered_pages(found);
        let budget_left = self
            .pin_budget_pages
            .saturating_sub(self.num_pin_covered_pages);
        if new_pages > budget_left {
            return Err(KvError::InvalidArgument(format!(
                "pin: {new_pages} more pinned pages exceed the pin budget ({budget_left} of {} \
                 pages left)",
                self.pin_budget_pages
            )));
        }
        let end = self.split_at(found);
        let expiry = now.saturating_add(ttl);
        let old = self.nodes[end as usize].pin_expiry;
        if old != 0 {
            if expiry > old {
                let seq = self.nodes[end as usize].pin_seq;
                self.pins.remove(&(old, seq, end));
                self.pins.insert((expiry, seq, end));
                self.nodes[end as usize].pin_expiry = expiry;
                self.refresh_next_expiry();
            }
            return Ok(found.total);
        }
        let mut id = end;
        while id != ROOT {
            let n = &mut self.nodes[id as usize];
            n.pin_ref += 1;
            if n.pin_ref == 1 {
                let num = n.pages.len();
                self.num_pin_covered_pages += num;
                if n.lock_ref == 0 {
                    self.leave_index(id);
                    self.shift(Class::Evictable, Class::Pinned, num);
                }
            }
            id = self.nodes[id as usize].parent;
        }
        let seq = self.next_pin_seq;
        self.next_pin_seq += 1;
        self.nodes[end as usize].pin_expiry = expiry;
        self.nodes[end as usize].pin_seq = seq;
        self.pins.insert((expiry, seq, end));
        self.refresh_next_expiry();
        Ok(found.total)
    }

    /// Pages that a [`pin`](Self::pin) of `tokens` from `ns` would newly cover (what it adds to
    /// the pin budget's count; pins expired but not yet released still cover theirs).
    pub fn pin_new_pages(&self, ns: Namespace, tokens: &[u32]) -> usize {
        self.uncovered_pages(self.find(ns, tokens))
    }

    /// Pages of the path to `found` that no pin covers: pin_ref is 0 on a bottom segment of it.
    fn uncovered_pages(&self, found: Found) -> usize {
        let mut new_pages = 0;
        let mut id = found.node;
        let mut len = found.in_node;
        while id != ROOT && self.nodes[id as usize].pin_ref == 0 {
            new_pages += len;
            id = self.nodes[id as usize].parent;
            len = self.nodes[id as usize].pages.len();
        }
        new_pages
    }

    /// Removes the deepest pin that ends on the cached path of `tokens` visible from `ns` (at a
    /// node that `tokens` covers entirely). Returns the number of pages no pin covers any more
    /// (0 if there was no such pin).
    pub fn unpin(&mut self, ns: Namespace, tokens: &[u32]) -> usize {
        let found = self.find(ns, tokens);
        let mut id = found.node;
        if found.in_node < self.nodes[id as usize].pages.len() {
            id = self.nodes[id as usize].parent;
        }
        while id != ROOT {
            if self.nodes[id as usize].pin_expiry != 0 {
                return self.release_pin(id);
            }
            id = self.nodes[id as usize].parent;
        }
        0
    }

    /// Releases every pin with `expiry <= now`, O(log n + path length) each. Returns the number
    /// of pages no pin covers any more. Called by `match_prefix`, `insert`, `extend`, `pin` and
    /// `evict`; call it before reading the counters for up-to-date figures.
    pub fn expire_pins(&mut self, now: u64) -> usize {
        let mut released = 0;
        while self.next_pin_expiry <= now {
            let Some(&(_, _, end)) = self.pins.first() else {
                break;
            };
            released += self.release_pin(end);
        }
        released
    }

    /// Bring every pin that would outlive `now + max_ttl` down to expire then (memory pressure:
    /// pinned pages become evictable sooner); returns the pins shortened. Pins already due sooner
    /// are untouched; expired ones are released first.
    pub fn cap_pins(&mut self, max_ttl: u64, now: u64) -> usize {
        self.expire_pins(now);
        let limit = now.saturating_add(max_ttl);
        let late: Vec<(u64, u64, NodeId)> = self.pins.range((limit + 1, 0, 0)..).copied().collect();
        for &(expiry, seq, end) in &late {
            self.pins.remove(&(expiry, seq, end));
            self.pins.insert((limit, seq, end));
            self.nodes[end as usize].pin_expiry = limit;
        }
        if !late.is_empty() {
            self.refresh_next_expiry();
        }
        late.len()
    }

    /// Removes the pin ending at `end`; returns the pages no pin covers any more.
    fn release_pin(&mut self, end: NodeId) -> usize {
        let (expiry, seq) = (
            self.nodes[end as usize].pin_expiry,
            self.nodes[end as usize].pin_seq,
        );
        debug_assert!(expiry != 0);
        self.pins.remove(&(expiry, seq, end));
        self.refresh_next_expiry();
        self.nodes[end as usize].pin_expiry = 0;
        let mut released = 0;
        let mut id = end;
        while id != ROOT {
            let n = &mut self.nodes[id as usize];
            debug_assert!(n.pin_ref > 0);
            n.pin_ref -= 1;
            if n.pin_ref == 0 {
                let num = n.pages.len();
                released += num;
                self.num_pin_covered_pages -= num;
                if n.lock_ref == 0 {
                    self.shift(Class::Pinned, Class::Evictable, num);
                    self.release(id);
                }
            }
            id = self.nodes[id as usize].parent;
        }
        released
    }

    /// Releases every pin, expired or not (a reset of the cache). Returns the number of pins.
    pub fn clear_pins(&mut self) -> usize {
        let ends: Vec<NodeId> = self.pins.iter().map(|&(_, _, end)| end).collect();
        for &end in &ends {
            self.release_pin(end);
        }
        ends.len()
    }

    fn refresh_next_expiry(&mut self) {
        self.next_pin_expiry = self.pins.first().map_or(u64::MAX, |&(e, _, _)| e);
    }

    /// Sets the most pages pins may cover (locked or not). Lowering it below the current use
    /// keeps the existing pins; new pins that add pages then fail.
    pub fn set_pin_budget_pages(&mut self, pages: usize) {
        self.pin_budget_pages = pages;
    }

    /// The pin budget in pages (`usize::MAX`: unlimited, the default).
    pub fn pin_budget_pages(&self) -> usize {
        self.pin_budget_pages
    }

    /// Pages covered by a pin, locked or not: what the pin budget limits (O(1)). Differs from
    /// [`num_pinned_pages`](Self::num_pinned_pages), which leaves out locked pages.
    pub fn num_pin_covered_pages(&self) -> usize {
        self.num_pin_covered_pages
    }

    /// Number of pins (including expired ones not yet released).
    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }

    // ---------------------------------------------------------------------------------------
    // Counters and inspection
    // ---------------------------------------------------------------------------------------

    /// Pages held by the tree (O(1)) = evictable + locked + pinned.
    pub fn num_cached_pages(&self) -> usize {
        self.num_cached_pages
    }

    /// Pages in nodes neither locked nor pinned (O(1)): what [`evict`](Self::evict) can free,
    /// all of it.
    pub fn num_evictable_pages(&self) -> usize {
        self.num_evictable_pages
    }

    /// Pages in nodes with `lock_ref > 0` (O(1)), pinned or not.
    pub fn num_locked_pages(&self) -> usize {
        self.num_locked_pages
    }

    /// Pages covered by a pin and not locked (O(1)). Includes pins expired but not yet released
    /// (see [`expire_pins`](Self::expire_pins)).
    pub fn num_pinned_pages(&self) -> usize {
        self.num_pinned_pages
    }

    /// Live nodes owned by `ns` (the public namespace's own nodes for [`PUBLIC_NAMESPACE`]).
    pub fn num_namespace_nodes(&self, ns: Namespace) -> usize {
        if ns == PUBLIC_NAMESPACE {
            self.num_public_nodes
        } else {
            self.ns_nodes.get(&ns).copied().unwrap_or(0)
        }
    }

    /// Appends to `out` the namespaces whose last node was dropped (by eviction) since the last
    /// call, and forgets them. A namespace may be listed and have nodes again if it cached something
    /// since: check [`num_namespace_nodes`](Self::num_namespace_nodes).
    pub fn take_emptied_namespaces(&mut self, out: &mut Vec<Namespace>) {
        out.append(&mut self.emptied);
    }

    /// Number of nodes, the root excluded.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free_ids.len()
    }

    /// Whether the tree holds `page`.
    pub fn contains_page(&self, page: PageId) -> bool {
        self.in_tree.contains(page)
    }

    /// Every page held by the tree, in no particular order (O(number of nodes + pages)).
    pub fn pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.nodes
            .iter()
            .skip(1)
            .filter(|n| n.live)
            .flat_map(|n| n.pages.iter().copied())
    }

    /// The last page of `node`'s edge; None for the root or a node not live.
    pub fn last_page(&self, node: NodeId) -> Option<PageId> {
        self.live_node(node)?.pages.last().copied()
    }

    /// Every live node but the root as `(node, parent, namespace, pages)`, parents before their
    /// children (by depth): the tree's whole content, for a consumer that must rebuild it.
    pub fn nodes_by_depth(&self) -> Vec<NodeView<'_>> {
        let mut depth = vec![u32::MAX; self.nodes.len()];
        depth[ROOT as usize] = 0;
        let mut chain = Vec::new();
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if !n.live || depth[id] != u32::MAX {
                continue;
            }
            let mut at = id;
            while depth[at] == u32::MAX {
                chain.push(at);
                at = self.nodes[at].parent as usize;
            }
            let mut d = depth[at];
            while let Some(x) = chain.pop() {
                d += 1;
                depth[x] = d;
            }
        }
        let mut out: Vec<_> = (1..self.nodes.len())
            .filter(|&id| self.nodes[id].live)
            .map(|id| {
                let n = &self.nodes[id];
                (
                    id as NodeId,
                    n.parent,
                    n.ns,
                    n.pages.as_slice(),
                    n.tokens.as_slice(),
                )
            })
            .collect();
        out.sort_by_key(|&(id, ..)| (depth[id as usize], id));
        out
    }

    /// Number of pages on the path from the root to `node` (its prefix length in pages), or
    /// None if `node` is not live. O(depth).
    pub fn node_prefix_pages(&self, node: NodeId) -> Option<usize> {
        self.live_node(node)?;
        let mut total = 0;
        let mut id = node;
        while id != ROOT {
            total += self.nodes[id as usize].pages.len();
            id = self.nodes[id as usize].parent;
        }
        Some(total)
    }

    /// Leading pages of the path to the end of `node` that public nodes hold (a path is public
    /// pages from the root, then one namespace's). A walk of the path's nodes, not of its pages.
    pub fn public_pages(&self, node: NodeId) -> usize {
        if self.num_public_nodes == 0 {
            return 0;
        }
        let mut total = 0;
        let mut id = node;
        while id != ROOT {
            let n = &self.nodes[id as usize];
            if n.ns == PUBLIC_NAMESPACE {
                total += n.pages.len();
            }
            id = n.parent;
        }
        total
    }

    /// The last `last` pages of the path from the root to the end of `node` (fewer if the path is
    /// shorter), in root-to-`node` order, each with the namespace of the node holding it.
    pub fn path_pages(&self, node: NodeId, last: usize, out: &mut Vec<(PageId, Namespace)>) {
        let start = out.len();
        let mut id = node;
        while id != ROOT && out.len() - start < last {
            let n = &self.nodes[id as usize];
            for &p in n.pages.iter().rev() {
                if out.len() - start == last {
                    break;
                }
                out.push((p, n.ns));
            }
            id = n.parent;
        }
        out[start..].reverse();
    }

    /// The node on `node`'s root path that ends exactly `pages` pages from the root ([`ROOT`] for
    /// 0), splitting the node the cut falls inside (the new node inherits its locks and pins, as
    /// any split). For moving a truncated sequence's lock up its path.
    /// Err(InvalidArgument) if `node` is not live or its path holds fewer than `pages` pages.
    pub fn cut_path(&mut self, node: NodeId, pages: usize) -> KvResult<NodeId> {
        let mut depth = self.node_prefix_pages(node).ok_or_else(|| {
            KvError::InvalidArgument(format!("cut_path: node {node} is not live"))
        })?;
        if pages > depth {
            return Err(KvError::InvalidArgument(format!(
                "cut_path: node {node} ends {depth} pages deep, cannot cut at {pages}"
            )));
        }
        if pages == 0 {
            return Ok(ROOT);
        }
        let mut x = node;
        loop {
            let start = depth - self.nodes[x as usize].pages.len();
            if pages == depth {
                return Ok(x);
            }
            if pages > start {
                return Ok(self.split(x, pages - start));
            }
            depth = start;
            x = self.nodes[x as usize].parent;
        }
    }

    /// Checks every internal invariant against a brute-force recount (O(n log n)); for tests.
    /// Returns a description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        check::check(self)
    }

    /// Test hook: makes every page hash collide, so that lookups go through collision chains.
    /// Only on an empty tree (Err(InvalidArgument) otherwise).
    #[doc(hidden)]
    pub fn force_hash_collisions_for_tests(&mut self) -> KvResult<()> {
        if self.num_nodes() != 0 {
            return Err(KvError::InvalidArgument(
                "force_hash_collisions_for_tests: the tree is not empty".into(),
            ));
        }
        self.hash_mask = 0;
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Internals: lookup
    // ---------------------------------------------------------------------------------------

    #[inline]
    fn hash(&self, page: &[u32]) -> u64 {
        hash_page(self.seed, page)
    }

    #[inline]
    fn child_key(&self, parent: NodeId, ns: Namespace, page_hash: u64) -> u64 {
        child_key(parent, ns, page_hash) & self.hash_mask
    }

    /// The child of `parent` owned by `ns` whose first page is `page` (hashing to `hash`).
    #[inline]
    fn child(&self, parent: NodeId, ns: Namespace, hash: u64, page: &[u32]) -> Option<NodeId> {
        let mut c = *self.children.get(&self.child_key(parent, ns, hash))?;
        loop {
            let n = &self.nodes[c as usize];
            if n.parent == parent && n.ns == ns && n.tokens.starts_with(page) {
                return Some(c);
            }
            c = n.chain_next;
            if c == NIL {
                return None;
            }
        }
    }

    /// Whole pages of `tokens[pos * page_size..]` matching node `c`'s run, `c` having been
    /// found by its first page (so that page is not compared again; the result is >= 1).
    #[inline]
    fn match_node(&self, c: NodeId, tokens: &[u32], pos: usize) -> usize {
        let ps = self.page_size;
        let run = &self.nodes[c as usize].tokens;
        let rest = &tokens[pos * ps..];
        let len = run.len().min(rest.len() / ps * ps);
        debug_assert!(len >= ps && run[..ps] == rest[..ps]);
        let (a, b) = (&run[ps..len], &rest[ps..len]);
        if a == b {
            return len / ps;
        }
        1 + a
            .chunks_exact(ps)
            .zip(b.chunks_exact(ps))
            .take_while(|(x, y)| x == y)
            .count()
    }

    /// The longest path for `tokens` visible from `ns` (module docs, "Namespaces").
    fn find(&self, ns: Namespace, tokens: &[u32]) -> Found {
        self.find_from(ns, ROOT, tokens)
    }

    /// The longest continuation of `start`'s path by `tokens` visible from `ns` (`start` must be
    /// the root, public, or `ns`'s own). `total` counts pages of `tokens` only; when nothing
    /// matches, the result is `start` itself, whole.
    fn find_from(&self, ns: Namespace, start: NodeId, tokens: &[u32]) -> Found {
        let ps = self.page_size;
        let num_pages = tokens.len() / ps;
        let mut best = Found {
            node: start,
            in_node: self.nodes[start as usize].pages.len(),
            total: 0,
        };
        if num_pages == 0 {
            return best;
        }
        if self.nodes[start as usize].ns != PUBLIC_NAMESPACE {
            // Below a private node only its namespace's nodes continue the path.
            return self.find_own(ns, start, tokens);
        }
        // Walk the public trunk; at each of its node boundaries (the root included) try `ns`'s
        // own branch first, so that a tie goes to the path with fewer public pages.
        let mut cur = start;
        let mut pos = 0;
        loop {
            let page = &tokens[pos * ps..(pos + 1) * ps];
            let hash = self.hash(page);
            if ns != PUBLIC_NAMESPACE {
                if let Some(c) = self.child(cur, ns, hash, page) {
                    let f = self.walk(c, ns, tokens, pos);
                    if f.total > best.total {
                        best = f;
                    }
                }
            }
            if self.num_public_nodes == 0 {
                break;
            }
            let Some(c) = self.child(cur, PUBLIC_NAMESPACE, hash, page) else {
                break;
            };
            let m = self.match_node(c, tokens, pos);
            pos += m;
            if pos > best.total {
                best = Found {
                    node: c,
                    in_node: m,
                    total: pos,
                };
            }
            if m < self.nodes[c as usize].pages.len() || pos == num_pages {
                break;
            }
            cur = c;
        }
        best
    }

    /// The longest continuation of `start`'s path by `ns`'s own nodes (no public one).
    fn find_own(&self, ns: Namespace, start: NodeId, tokens: &[u32]) -> Found {
        let ps = self.page_size;
        let whole = Found {
            node: start,
            in_node: self.nodes[start as usize].pages.len(),
            total: 0,
        };
        if tokens.len() < ps {
            return whole;
        }
        let page = &tokens[..ps];
        match self.child(start, ns, self.hash(page), page) {
            Some(c) => self.walk(c, ns, tokens, 0),
            None => whole,
        }
    }

    /// Follows `ns`'s nodes from `c` (a child matching the page at `pos`) as far as `tokens`
    /// go.
    fn walk(&self, mut c: NodeId, ns: Namespace, tokens: &[u32], mut pos: usize) -> Found {
        let ps = self.page_size;
        let num_pages = tokens.len() / ps;
        loop {
            let m = self.match_node(c, tokens, pos);
            pos += m;
            let here = Found {
                node: c,
                in_node: m,
                total: pos,
            };
            if m < self.nodes[c as usize].pages.len() || pos == num_pages {
                return here;
            }
            let page = &tokens[pos * ps..(pos + 1) * ps];
            match self.child(c, ns, self.hash(page), page) {
                Some(next) => c = next,
                None => return here,
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Internals: structure
    // ---------------------------------------------------------------------------------------

    fn check_node(&self, node: NodeId) -> KvResult<()> {
        match self.live_node(node) {
            Some(_) => Ok(()),
            None => Err(KvError::InvalidArgument(format!(
                "unknown radix node {node}"
            ))),
        }
    }

    /// A node of `ns` was created.
    fn count_node(&mut self, ns: Namespace) {
        if ns == PUBLIC_NAMESPACE {
            self.num_public_nodes += 1;
        } else {
            *self.ns_nodes.entry(ns).or_default() += 1;
        }
    }

    /// A node of `ns` was dropped; its namespace is reported emptied when it was the last.
    fn uncount_node(&mut self, ns: Namespace) {
        if ns == PUBLIC_NAMESPACE {
            self.num_public_nodes -= 1;
            return;
        }
        if let Entry::Occupied(mut e) = self.ns_nodes.entry(ns) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
                self.emptied.push(ns);
            }
        }
    }

    fn live_node(&self, node: NodeId) -> Option<&Node> {
        self.nodes.get(node as usize).filter(|n| n.live)
    }

    fn alloc_node(&mut self) -> NodeId {
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                self.nodes.push(Node::empty());
                (self.nodes.len() - 1) as NodeId
            }
        };
        debug_assert!(!self.nodes[id as usize].live);
        self.nodes[id as usize].live = true;
        id
    }

    /// Returns `id`'s slot to the free list, keeping its vectors' capacity for reuse.
    fn free_node(&mut self, id: NodeId) {
        let n = &mut self.nodes[id as usize];
        let mut tokens = std::mem::take(&mut n.tokens);
        let mut pages = std::mem::take(&mut n.pages);
        tokens.clear();
        pages.clear();
        *n = Node {
            tokens,
            pages,
            ..Node::empty()
        };
        self.free_ids.push(id);
    }

    /// Adds `c` to its parent's child map (at the head of its collision chain).
    fn link_child(&mut self, c: NodeId) {
        let key = self.nodes[c as usize].key;
        let next = match self.children.insert(key, c) {
            Some(head) => head,
            None => NIL,
        };
        self.nodes[c as usize].chain_next = next;
    }

    /// Replaces `old` by `new` in `old`'s collision chain (`None`: just removes `old`).
    fn relink_child(&mut self, old: NodeId, new: Option<NodeId>) {
        let n = &self.nodes[old as usize];
        let key = n.key;
        let next = n.chain_next;
        let replacement = match new {
            Some(new) => {
                self.nodes[new as usize].chain_next = next;
                new
            }
            None => next,
        };
        let head = match self.children.entry(key) {
            Entry::Occupied(mut e) if *e.get() == old => {
                // One hash lookup in the common case (no collision chain).
                if replacement == NIL {
                    e.remove();
                } else {
                    e.insert(replacement);
                }
                None
            }
            Entry::Occupied(e) => Some(*e.get()),
            Entry::Vacant(_) => {
                debug_assert!(false, "node {old} missing from the child map");
                return;
            }
        };
        if let Some(head) = head {
            let mut prev = head;
            while self.nodes[prev as usize].chain_next != old {
                prev = self.nodes[prev as usize].chain_next;
                if prev == NIL {
                    debug_assert!(false, "node {old} missing from its chain");
                    return;
                }
            }
            self.nodes[prev as usize].chain_next = replacement;
        }
        self.nodes[old as usize].chain_next = NIL;
    }

    fn unlink_child(&mut self, c: NodeId) {
        self.relink_child(c, None);
    }

    /// Splits `found.node` so that a node ends exactly at `found` and returns it: the node
    /// itself if the match covers it, else a new parent holding its first `found.in_node` pages
    /// (the old id keeps the deeper part).
    fn split_at(&mut self, found: Found) -> NodeId {
        let x = found.node;
        let len = self.nodes[x as usize].pages.len();
        if found.in_node == len {
            return x;
        }
        debug_assert!(x != ROOT && found.in_node > 0 && found.in_node < len);
        self.split(x, found.in_node)
    }

    /// Moves the first `m` pages of `x` into a new node `p` inserted between `x` and its parent.
    /// `p` inherits `x`'s place in the child map, locks, pins (not the pin ending at `x`) and
    /// recency; the page counters do not move.
    fn split(&mut self, x: NodeId, m: usize) -> NodeId {
        let cut = m * self.page_size;
        let p = self.alloc_node();
        {
            let (xn, pn) = pair_mut(&mut self.nodes, x as usize, p as usize);
            pn.tokens.extend_from_slice(&xn.tokens[..cut]);
            pn.pages.extend_from_slice(&xn.pages[..m]);
            xn.tokens.drain(..cut);
            xn.pages.drain(..m);
            pn.parent = xn.parent;
            pn.ns = xn.ns;
            pn.key = xn.key;
            pn.num_children = 1;
            pn.lock_ref = xn.lock_ref;
            pn.pin_ref = xn.pin_ref;
            pn.hits = xn.hits;
            pn.tick = xn.tick;
            pn.priority = xn.priority;
        }
        // p takes x's slot under the parent (same key: same first page), x goes under p.
        self.relink_child(x, Some(p));
        let hash = self.hash(&self.nodes[x as usize].tokens[..self.page_size]);
        let key = self.child_key(p, self.nodes[x as usize].ns, hash);
        let xn = &mut self.nodes[x as usize];
        xn.parent = p;
        xn.key = key;
        self.link_child(x);
        self.count_node(self.nodes[p as usize].ns);
        // The index keeps ancestors after descendants: p goes right after x, in x's level.
        if self.nodes[x as usize].in_index {
            let key = self.key_of(p);
            self.index.insert_after(x, p, key);
            self.nodes[p as usize].in_index = true;
        }
        p
    }

    /// Creates a child of `parent` owned by `ns` holding `tokens`/`pages` (already claimed in
    /// `in_tree`); it starts evictable, untouched.
    fn add_child(
        &mut self,
        parent: NodeId,
        ns: Namespace,
        tokens: &[u32],
        pages: &[PageId],
    ) -> NodeId {
        let key = self.child_key(parent, ns, self.hash(&tokens[..self.page_size]));
        let c = self.alloc_node();
        let n = &mut self.nodes[c as usize];
        n.parent = parent;
        n.ns = ns;
        n.key = key;
        n.tokens.extend_from_slice(tokens);
        n.pages.extend_from_slice(pages);
        self.link_child(c);
        self.count_node(ns);
        self.floor_count(ns, pages.len() as isize);
        self.nodes[parent as usize].num_children += 1;
        self.num_cached_pages += pages.len();
        self.num_evictable_pages += pages.len();
        self.sync_index(c);
        c
    }

    // ---------------------------------------------------------------------------------------
    // Internals: eviction order and counters
    // ---------------------------------------------------------------------------------------

    fn key_of(&self, id: NodeId) -> EvictKey {
        let n = &self.nodes[id as usize];
        self.policy.key(n.hits, n.priority, n.tick)
    }

    /// Whether `id` belongs in the eviction index now: every evictable node does.
    fn wants_index(&self, id: NodeId) -> bool {
        id != ROOT && self.nodes[id as usize].class() == Class::Evictable
    }

    /// Puts `id` in or out of the index as its state requires (in: at the back of its level).
    fn sync_index(&mut self, id: NodeId) {
        let want = self.wants_index(id);
        if want == self.nodes[id as usize].in_index {
            return;
        }
        if want {
            let key = self.key_of(id);
            self.index.insert(id, key);
        } else {
            self.index.remove(id);
        }
        self.nodes[id as usize].in_index = want;
    }

    fn leave_index(&mut self, id: NodeId) {
        if self.nodes[id as usize].in_index {
            self.index.remove(id);
            self.nodes[id as usize].in_index = false;
        }
    }

    /// `id` just became evictable: it counts as used now (Lru: it goes to the back).
    fn release(&mut self, id: NodeId) {
        debug_assert!(!self.nodes[id as usize].in_index);
        self.tick += 1;
        self.nodes[id as usize].tick = self.tick;
        self.sync_index(id);
    }

    /// Records a use of `id` by an insert or match with `priority`.
    fn touch(&mut self, id: NodeId, priority: i32) {
        self.tick += 1;
        let n = &mut self.nodes[id as usize];
        n.tick = self.tick;
        n.hits = n.hits.saturating_add(1);
        n.priority = n.priority.max(priority);
        if n.in_index {
            let key = self.key_of(id);
            self.index.touch(id, key);
        }
    }

    fn counter(&mut self, class: Class) -> &mut usize {
        match class {
            Class::Evictable => &mut self.num_evictable_pages,
            Class::Locked => &mut self.num_locked_pages,
            Class::Pinned => &mut self.num_pinned_pages,
        }
    }

    /// Moves `num` pages from one counter to another.
    fn shift(&mut self, from: Class, to: Class, num: usize) {
        if from != to {
            *self.counter(from) -= num;
            *self.counter(to) += num;
        }
    }
}

impl Node {
    /// The class this node would have without its locks.
    fn class_without_lock(&self) -> Class {
        if self.pin_ref > 0 {
            Class::Pinned
        } else {
            Class::Evictable
        }
    }
}

/// Two distinct elements of a slice, mutably.
fn pair_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    debug_assert_ne!(a, b);
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}
