//! Bounded caches (F8): KV-cache groups with sliding windows, StreamingLLM sinks + recent tokens,
//! and page-level heavy-hitter compaction.
//!
//! Provenance: vLLM's hybrid allocator (one page table per group of layers, one shared pool, a
//! sliding-window hit needing only the last `ceil(W / page_size)` pages before the hit point),
//! SGLang's `SWARadixCache` (window pages released as the sequence moves on, while full-attention
//! pages stay), StreamingLLM (attention sinks + a recent window) and OpenVINO GenAI's block-level
//! score eviction (H2O at page granularity). What differs:
//! - the *primary* group (the first full-attention group; the first group when every group is
//!   windowed) keeps the radix tree, locks and lower tiers' page keys as before; every other
//!   group's full pages are cached in a hash map keyed by page key ([`crate::keys`], chained over
//!   the same namespaces as the tree path), so a window group's cached pages can be evicted in
//!   any order (holes are free: no tombstones);
//! - a released page shows as the null page in its group's table: positions stay implicit (page
//!   `i` holds tokens `i * page_size..`), and [`KVCacheManager::positions`] gives the original
//!   positions of the kept tokens for kernels that read a compacted table.
//!
//! # When pages are released
//! Each sequence tracks `computed`: tokens whose K/V the engine has computed (the cached prefix at
//! admission; every old token on `append`; the reserved prompt on `reserve` of a sequence that
//! caches as it goes; `commit`'s count otherwise). Every query still to come is at a position
//! `>= computed`, so a window group of `W` tokens no longer needs a page that ends at or before
//! `computed + 1 - W`; a streaming sequence's full groups no longer need the pages between its
//! sink pages and its last `recent_tokens` tokens. Those pages are released (their cached copies,
//! if any, stay cached and evictable).
//!
//! # Privacy of compacted sequences
//! Tokens computed after a full-attention group lost a page (streaming or [`compact`]) attended to
//! a compacted context: their K/V differ from a full-context computation of the same tokens. Such a
//! sequence's pages from that point on are never cached (tree, maps or lower tiers): `private_from`.
//!
//! [`compact`]: KVCacheManager::compact

use std::collections::{BTreeSet, HashMap};

use super::{internal, unknown, KVCacheManager, SeqId, Sequence, State};
use crate::error::{try_with_capacity, KvError, KvResult};
use crate::keys::{page_key, PageKey};
use crate::radix::{FxBuildHasher, Namespace, PUBLIC_NAMESPACE};
use crate::{PageId, NULL_PAGE};

/// Most KV-cache groups of one manager.
pub const MAX_GROUPS: usize = 64;

/// Why an admission's prefix hit is as long as it is ([`PrefixHit::reason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitReason {
    /// Every cacheable prompt page was a hit (`len - 1` tokens, rounded down to whole pages).
    Full,
    /// The primary group holds no longer cached prefix (a plain miss past the hit).
    PrimaryMiss,
    /// A longer prefix is cached in the primary group, but a window group lacks pages just
    /// before every longer hit point (evicted, or never cached).
    WindowPagesMissing,
    /// A full-attention group other than the primary lacks pages of a longer prefix.
    GroupPagesMissing,
}

impl HitReason {
    /// The reason's name (`"full"`, `"primary_miss"`, `"window_pages_missing"`,
    /// `"group_pages_missing"`).
    pub fn name(self) -> &'static str {
        match self {
            HitReason::Full => "full",
            HitReason::PrimaryMiss => "primary_miss",
            HitReason::WindowPagesMissing => "window_pages_missing",
            HitReason::GroupPagesMissing => "group_pages_missing",
        }
    }
}

/// What an admission found cached, per group ([`KVCacheManager::prefix_hit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixHit {
    /// Tokens taken from the cache (the same for every group).
    pub num_tokens: usize,
    /// Per group, in the caller's group order: the longest hit that group alone allows.
    pub group_tokens: Vec<usize>,
    /// Why the hit is not longer.
    pub reason: HitReason,
}

/// One cached page of a non-primary group.
#[derive(Clone, Copy, Debug)]
struct Entry {
    group: u8,
    key: PageKey,
    /// The namespace it is keyed in (kept interned while it has cached pages).
    ns: Namespace,
    /// Group pins covering it (see [`Groups::pins`]): not evictable while > 0, even with no user.
    pin_ref: u32,
    /// Live sequences holding the page in their table.
    users: u32,
    /// Recency stamp while evictable (`users == 0`).
    stamp: u64,
}

/// The groups of a manager and the cache of every non-primary group's pages.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Window per internal group (`None`: full attention); `[0]` is the primary group.
    pub windows: Vec<Option<usize>>,
    /// Internal index of each caller group.
    pub to_internal: Vec<usize>,
    entries: HashMap<PageId, Entry, FxBuildHasher>,
    by_key: HashMap<(u8, PageKey), PageId, FxBuildHasher>,
    /// Evictable entries, least recently used first.
    lru: BTreeSet<(u64, PageId)>,
    clock: u64,
    /// Cached pages per namespace (a windowed primary has no tree to keep a name interned).
    ns_pages: HashMap<Namespace, usize, FxBuildHasher>,
    /// Cached pages per (internal group, namespace): what a tenant quota counts in a group cache.
    group_ns_pages: HashMap<(u8, Namespace), usize, FxBuildHasher>,
    /// Namespaces whose last cached page went (for the manager to forget if unused).
    emptied: Vec<Namespace>,
    /// TTL pins, by the key of the pinned prefix's last page (a chained key names the whole
    /// prefix, and the namespace of its own pages, so a pin is the tree pin's twin: a pin on a
    /// public prefix is the same pin from every namespace, a tenant's is its own).
    pins: HashMap<PageKey, GroupPin, FxBuildHasher>,
    /// `(until, key)` of `pins`, soonest first.
    pin_order: BTreeSet<(u64, PageKey)>,
    /// Entries some pin covers, held or not (what the pin budget counts).
    pin_covered: usize,
    /// Pinned entries no sequence holds (cached, not evictable: the stats' pinned pages).
    pinned_idle: usize,
}

/// One TTL pin's group-cache pages: those a hit of its prefix needs.
#[derive(Clone, Debug)]
struct GroupPin {
    /// Expires once the clock reaches it.
    until: u64,
    pages: Vec<PageId>,
}

/// A sequence's bounded-cache state (absent for the unbounded common case).
#[derive(Clone, Debug, Default)]
pub(super) struct Bounds {
    /// Tokens whose K/V the engine has computed (see the module docs).
    pub computed: usize,
    /// Per internal group: pages `[start, cursor)` are released (start: 0 for windows, the sink
    /// pages for streaming full groups).
    pub cursor: Vec<usize>,
    /// Streaming: (sink pages kept, recent tokens kept).
    pub streaming: Option<(usize, usize)>,
    /// Tokens from which the sequence's pages are never cached (see the module docs).
    pub private_from: Option<usize>,
    /// The admission's hit per group.
    pub hit: Option<PrefixHit>,
}

impl Groups {
    pub fn new(groups: &[Option<usize>]) -> KvResult<Self> {
        if groups.len() > MAX_GROUPS {
            return Err(KvError::InvalidArgument(format!(
                "at most {MAX_GROUPS} KV-cache groups, got {}",
                groups.len()
            )));
        }
        if let Some(w) = groups.iter().flatten().find(|&&w| w == 0) {
            return Err(KvError::InvalidArgument(format!(
                "a group's window must be >= 1 token (None for full attention), got {w}"
            )));
        }
        let windows = if groups.is_empty() {
            vec![None]
        } else {
            groups.to_vec()
        };
        // The primary group: the first full-attention one, else the first.
        let primary = windows.iter().position(Option::is_none).unwrap_or(0);
        let mut order: Vec<usize> = vec![primary];
        order.extend((0..windows.len()).filter(|&g| g != primary));
        let mut to_internal = vec![0; windows.len()];
        for (internal_g, &caller_g) in order.iter().enumerate() {
            to_internal[caller_g] = internal_g;
        }
        Ok(Self {
            windows: order.iter().map(|&g| windows[g]).collect(),
            to_internal,
            ..Self::default()
        })
    }

    /// Whether any group other than one full-attention group exists.
    pub fn active(&self) -> bool {
        self.windows.len() > 1 || self.windows[0].is_some()
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// Whether the primary group is windowed (then the tree caches nothing).
    pub fn primary_windowed(&self) -> bool {
        self.windows[0].is_some()
    }

    /// The internal index of caller group `g`.
    pub fn internal(&self, g: usize) -> KvResult<usize> {
        self.to_internal.get(g).copied().ok_or_else(|| {
            KvError::InvalidArgument(format!(
                "group {g} out of range: this manager has {} group(s)",
                self.windows.len()
            ))
        })
    }

    /// Cached non-primary pages nothing but the cache holds.
    pub fn num_evictable(&self) -> usize {
        self.lru.len()
    }

    /// Every page the group caches hold (for invariant checks).
    pub fn pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.entries.keys().copied()
    }

    /// Whether group `g`'s pages are cached in the maps (every group but a full primary).
    fn mapped(&self, g: usize) -> bool {
        g > 0 || self.primary_windowed()
    }

    /// A sequence dropped one reference on `page`.
    fn on_release(&mut self, page: PageId) {
        if let Some(e) = self.entries.get_mut(&page) {
            e.users = e.users.saturating_sub(1);
            if e.users == 0 {
                if e.pin_ref > 0 {
                    self.pinned_idle += 1;
                } else {
                    self.clock += 1;
                    e.stamp = self.clock;
                    self.lru.insert((e.stamp, page));
                }
            }
        }
    }

    /// A sequence took one reference on `page`.
    fn on_retain(&mut self, page: PageId) {
        if let Some(e) = self.entries.get_mut(&page) {
            if e.users == 0 {
                if e.pin_ref > 0 {
                    self.pinned_idle -= 1;
                } else {
                    self.lru.remove(&(e.stamp, page));
                }
            }
            e.users += 1;
        }
    }

    fn lookup(&self, g: usize, key: &PageKey) -> Option<PageId> {
        self.by_key.get(&(g as u8, *key)).copied()
    }

    /// One more pin covers cached `page`.
    fn pin_ref_add(&mut self, page: PageId) {
        let Some(e) = self.entries.get_mut(&page) else {
            return;
        };
        e.pin_ref += 1;
        if e.pin_ref == 1 {
            self.pin_covered += 1;
            if e.users == 0 {
                self.lru.remove(&(e.stamp, page));
                self.pinned_idle += 1;
            }
        }
    }

    /// One pin less covers cached `page`; whether none does any more.
    fn pin_ref_drop(&mut self, page: PageId) -> bool {
        let Some(e) = self.entries.get_mut(&page) else {
            return false;
        };
        debug_assert!(e.pin_ref > 0);
        e.pin_ref = e.pin_ref.saturating_sub(1);
        if e.pin_ref > 0 {
            return false;
        }
        self.pin_covered -= 1;
        if e.users == 0 {
            self.pinned_idle -= 1;
            self.clock += 1;
            e.stamp = self.clock;
            self.lru.insert((e.stamp, page));
        }
        true
    }

    /// The pages of `pages` (a pin of the prefix ending with `key`) that no pin covers yet: what
    /// that pin would add to the budget's count (0 if the prefix is pinned: it would only extend).
    pub(super) fn new_pin_pages(&self, key: &PageKey, pages: &[PageId]) -> usize {
        if self.pins.contains_key(key) {
            return 0;
        }
        pages
            .iter()
            .filter(|p| self.entries.get(p).is_some_and(|e| e.pin_ref == 0))
            .count()
    }

    /// Pin `pages` (cached, distinct) for the prefix ending with `key` until `until`; a prefix
    /// pinned already keeps its pages and its pin ends at the later of the two.
    pub(super) fn add_pin(&mut self, key: PageKey, until: u64, pages: Vec<PageId>) {
        if let Some(pin) = self.pins.get_mut(&key) {
            if until > pin.until {
                self.pin_order.remove(&(pin.until, key));
                pin.until = until;
                self.pin_order.insert((until, key));
            }
            return;
        }
        for &page in &pages {
            self.pin_ref_add(page);
        }
        self.pin_order.insert((until, key));
        self.pins.insert(key, GroupPin { until, pages });
    }

    /// Remove the pin of the prefix ending with `key`; returns the pages no pin covers any more.
    fn remove_pin(&mut self, key: &PageKey) -> usize {
        let Some(pin) = self.pins.remove(key) else {
            return 0;
        };
        self.pin_order.remove(&(pin.until, *key));
        pin.pages
            .iter()
            .filter(|&&page| self.pin_ref_drop(page))
            .count()
    }

    /// Remove the deepest pin of the prefixes ending with `keys` (a path's page keys, root first);
    /// returns the pages no pin covers any more (0 if none is pinned).
    pub(super) fn unpin_deepest(&mut self, keys: &[PageKey]) -> usize {
        match keys.iter().rev().find(|k| self.pins.contains_key(*k)) {
            Some(&key) => self.remove_pin(&key),
            None => 0,
        }
    }

    /// Release the pins expired at `now` (their pages become ordinary LRU pages).
    pub(super) fn expire_pins(&mut self, now: u64) {
        while let Some(&(until, key)) = self.pin_order.first() {
            if until > now {
                break;
            }
            self.remove_pin(&key);
        }
    }

    /// Shorten every pin to end by `limit` at the latest; returns how many were shortened.
    pub(super) fn cap_pins(&mut self, limit: u64) -> usize {
        let late: Vec<(u64, PageKey)> = self
            .pin_order
            .range((limit.saturating_add(1), [0; 16])..)
            .copied()
            .collect();
        for &(until, key) in &late {
            self.pin_order.remove(&(until, key));
            self.pin_order.insert((limit, key));
            if let Some(pin) = self.pins.get_mut(&key) {
                pin.until = limit;
            }
        }
        late.len()
    }

    /// Entries some pin covers, held or not (they count against the pin budget).
    pub(super) fn num_pin_covered(&self) -> usize {
        self.pin_covered
    }

    /// Cached pages pinned with no user (counted as pinned in the stats).
    pub(super) fn num_pinned_idle(&self) -> usize {
        self.pinned_idle
    }

    /// Whether `ns` has cached pages in a group cache.
    pub(super) fn holds_namespace(&self, ns: Namespace) -> bool {
        self.ns_pages.contains_key(&ns)
    }

    /// Group `g`'s cached page for `key`, or the null page.
    pub(super) fn page_of(&self, g: usize, key: &PageKey) -> PageId {
        self.lookup(g, key).unwrap_or(NULL_PAGE)
    }

    /// Take up to `n` evictable pages, least recently used first, out of the cache (the caller
    /// releases the cache's reference on each). With tenant `quotas` (`namespace -> (floor,
    /// ceiling)`), counted in each group's own pages as the tree counts its own: first the pages
    /// of a tenant past its ceiling in their group, then those of tenants without a floor or
    /// above it, and a tenant's pages at or below its floor last, only with `yield_floors` (a
    /// floor yields only when nothing else can go), each class least recently used first.
    fn take_lru(
        &mut self,
        n: usize,
        quotas: &HashMap<Namespace, (usize, Option<usize>), FxBuildHasher>,
        yield_floors: bool,
        out: &mut Vec<PageId>,
    ) {
        if quotas.is_empty() {
            for _ in 0..n {
                let Some((_, page)) = self.lru.pop_first() else {
                    return;
                };
                self.remove_entry(page);
                out.push(page);
            }
            return;
        }
        let mut victims: Vec<(u64, PageId)> = Vec::new();
        let mut chosen: std::collections::HashSet<PageId, FxBuildHasher> = Default::default();
        // Each (group, tenant)'s count once the victims so far are gone.
        let mut left: HashMap<(u8, Namespace), usize, FxBuildHasher> = HashMap::default();
        for class in 0..if yield_floors { 3 } else { 2 } {
            for &(stamp, page) in &self.lru {
                if victims.len() == n {
                    break;
                }
                if chosen.contains(&page) {
                    continue;
                }
                let Some(e) = self.entries.get(&page) else {
                    continue;
                };
                let key = (e.group, e.ns);
                let count = *left
                    .entry(key)
                    .or_insert_with(|| self.group_ns_pages.get(&key).copied().unwrap_or(0));
                let take = match (class, quotas.get(&e.ns)) {
                    (0, Some(&(_, Some(ceiling)))) => count > ceiling,
                    (0, _) => false,
                    (1, Some(&(floor, _))) => count > floor,
                    _ => true,
                };
                if take {
                    victims.push((stamp, page));
                    chosen.insert(page);
                    left.insert(key, count.saturating_sub(1));
                }
            }
        }
        for (stamp, page) in victims {
            self.lru.remove(&(stamp, page));
            self.remove_entry(page);
            out.push(page);
        }
    }

    /// The per-namespace and per-(group, namespace) counts equal the entries' (for tests).
    pub(super) fn check_counts(&self) -> Result<(), String> {
        let mut by_ns: HashMap<Namespace, usize, FxBuildHasher> = HashMap::default();
        let mut by_group: HashMap<(u8, Namespace), usize, FxBuildHasher> = HashMap::default();
        for e in self.entries.values() {
            *by_ns.entry(e.ns).or_insert(0) += 1;
            *by_group.entry((e.group, e.ns)).or_insert(0) += 1;
        }
        if by_ns != self.ns_pages || by_group != self.group_ns_pages {
            return Err(format!(
                "group caches: pages per namespace {:?} / per group {:?}, counted {:?} / {:?}",
                by_ns, by_group, self.ns_pages, self.group_ns_pages
            ));
        }
        Ok(())
    }

    /// Forget the cached entry of `page` (out of the LRU already), keeping the counts.
    fn remove_entry(&mut self, page: PageId) {
        let Some(e) = self.entries.remove(&page) else {
            return;
        };
        self.by_key.remove(&(e.group, e.key));
        if let Some(c) = self.group_ns_pages.get_mut(&(e.group, e.ns)) {
            *c -= 1;
            if *c == 0 {
                self.group_ns_pages.remove(&(e.group, e.ns));
            }
        }
        if let Some(n) = self.ns_pages.get_mut(&e.ns) {
            *n -= 1;
            if *n == 0 {
                self.ns_pages.remove(&e.ns);
                self.emptied.push(e.ns);
            }
        }
    }
}

impl Bounds {
    /// First page of group `g` whose release depends on `computed` (see [`drop_limit`]).
    fn start(&self, window: Option<usize>) -> usize {
        match (window, self.streaming) {
            (None, Some((sinks, _))) => sinks,
            _ => 0,
        }
    }

    /// Pages `[start, limit)` of a group with `window` are no longer needed once `computed`
    /// tokens are computed.
    fn limit(&self, window: Option<usize>, ps: usize, computed: usize) -> usize {
        let keep = match (window, self.streaming) {
            (Some(w), _) => w,
            (None, Some((_, recent))) => recent,
            (None, None) => return 0,
        };
        (computed + 1).saturating_sub(keep) / ps
    }
}

impl Sequence {
    /// The table of internal group `g`.
    pub(super) fn table(&self, g: usize) -> &[PageId] {
        if g == 0 {
            &self.pages
        } else {
            &self.extra[g - 1]
        }
    }

    pub(super) fn table_mut(&mut self, g: usize) -> &mut Vec<PageId> {
        if g == 0 {
            &mut self.pages
        } else {
            &mut self.extra[g - 1]
        }
    }

    /// Whether the sequence needs the bounded-cache paths.
    pub(super) fn bounded(&self) -> bool {
        self.bounds.is_some()
    }
}

/// Non-null pages of a table.
fn live(pages: &[PageId]) -> impl Iterator<Item = PageId> + '_ {
    pages.iter().copied().filter(|&p| p != NULL_PAGE)
}

impl KVCacheManager {
    /// Drop one sequence reference on each non-null page of `pages` (the group caches learn which
    /// of their pages became evictable).
    pub(super) fn release_table(&self, st: &mut State, pages: &[PageId]) -> KvResult<()> {
        let held: Vec<PageId> = live(pages).collect();
        for &p in &held {
            st.groups.on_release(p);
        }
        self.release(st, &held)
    }

    /// Take one sequence reference on each non-null page of `pages`.
    pub(super) fn retain_table(&self, st: &mut State, pages: &[PageId]) -> KvResult<()> {
        let held: Vec<PageId> = live(pages).collect();
        self.alloc.retain_serialized(&held).map_err(internal)?;
        for &p in &held {
            st.groups.on_retain(p);
        }
        Ok(())
    }

    /// Release every table of a sequence removed from the state.
    pub(super) fn release_sequence_pages(&self, st: &mut State, seq: &Sequence) -> KvResult<()> {
        if seq.extra.is_empty() && seq.bounds.is_none() {
            return self.release(st, &seq.pages);
        }
        self.release_table(st, &seq.pages)?;
        for t in &seq.extra {
            self.release_table(st, t)?;
        }
        Ok(())
    }

    /// Evict up to `n` pages from the group caches (least recently used first, tenant quotas
    /// first: see `take_lru`; pages within floors only with `yield_floors`); returns how many.
    pub(super) fn evict_group_pages(
        &self,
        st: &mut State,
        n: usize,
        yield_floors: bool,
    ) -> KvResult<usize> {
        let mut out = Vec::new();
        // HBM tenant quotas of interned names (a name not interned has no cached page).
        let mut quotas: HashMap<Namespace, (usize, Option<usize>), FxBuildHasher> =
            HashMap::default();
        for ((name, tier), &q) in &st.tenant_floors {
            if tier.is_none() {
                if let Some(ns) = st.known_namespace(name.as_deref()) {
                    quotas.insert(ns, q);
                }
            }
        }
        st.groups.take_lru(n, &quotas, yield_floors, &mut out);
        // Only a windowed primary's pages were announced (the others' events are the tree's).
        self.record_removed(st, &out);
        self.release(st, &out)?;
        for ns in std::mem::take(&mut st.groups.emptied) {
            st.forget_if_unused(ns);
        }
        Ok(out.len())
    }

    /// The page keys of `tokens`' first `n` pages in namespace `ns`, each page keyed in the
    /// namespace of the tree node holding it when `path` gives one (a public trunk), as
    /// [`page_keys`](Self::page_keys) reports them. Stops early (fewer keys) at a page whose
    /// namespace has no name yet (nothing can be cached under it).
    fn chain_keys(
        &self,
        st: &State,
        ns: Namespace,
        tokens: &[u32],
        n: usize,
        path: &[(PageId, Namespace)],
        keys: &mut Vec<PageKey>,
    ) {
        let ps = self.page_size;
        while keys.len() < n {
            let i = keys.len();
            let page_ns = path.get(i).map_or(ns, |&(_, x)| x);
            let Some(kns) = st.key_namespace(page_ns) else {
                return;
            };
            let parent = if i == 0 { self.root_key } else { keys[i - 1] };
            keys.push(page_key(&parent, kns, &tokens[i * ps..(i + 1) * ps]));
        }
    }

    /// The prefix hit of `lookup` in `lookup_ns` over every group, without side effects: the
    /// pages every group allows, the keys of the candidate pages, each group's own longest hit
    /// in tokens (caller order) and why the hit is not longer.
    ///
    /// The primary group's candidates are its tree match (every page, when the primary is
    /// windowed: its map decides). A mapped group allows a hit of `d` pages when it holds the
    /// last `ceil(W / page_size)` pages before `d` (a window `W`; every page before `d` for full
    /// attention). The hit is the longest `d` every group allows.
    pub(super) fn peek_group_hit(
        &self,
        st: &State,
        lookup_ns: Namespace,
        lookup: &[u32],
    ) -> (usize, Vec<PageKey>, Vec<usize>, HitReason) {
        let ps = self.page_size;
        let groups = &st.groups;
        let bound = lookup.len() / ps;
        let mut path = Vec::new();
        let candidates = if groups.primary_windowed() {
            bound
        } else {
            st.tree.peek_prefix_pages_ns(lookup_ns, lookup, &mut path)
        };
        let mut keys = Vec::new();
        if !groups.active() {
            // One full group (a streaming sequence on a plain manager): the tree decides alone.
            let reason = if candidates >= bound {
                HitReason::Full
            } else {
                HitReason::PrimaryMiss
            };
            return (candidates, keys, vec![candidates * ps], reason);
        }
        if groups.primary_windowed() && lookup_ns != PUBLIC_NAMESPACE {
            // No tree to say where a public prefix ends: the longest prefix whose last page the
            // first group holds under its public key (a key chains every page before it), then
            // the namespace's own pages chained from it, as a tree path runs.
            self.chain_keys(st, PUBLIC_NAMESPACE, lookup, candidates, &[], &mut keys);
            let public = (1..=keys.len())
                .rev()
                .find(|&p| groups.lookup(0, &keys[p - 1]).is_some())
                .unwrap_or(0);
            keys.truncate(public);
        }
        self.chain_keys(st, lookup_ns, lookup, candidates, &path, &mut keys);
        let n = keys.len();
        let g_count = groups.num_groups();
        // runs[g][i]: consecutive cached pages of group g ending at page i (inclusive).
        let runs: Vec<Vec<usize>> = (0..g_count)
            .map(|g| {
                if !groups.mapped(g) {
                    return Vec::new();
                }
                let mut len = 0;
                keys.iter()
                    .map(|key| {
                        len = if groups.lookup(g, key).is_some() {
                            len + 1
                        } else {
                            0
                        };
                        len
                    })
                    .collect()
            })
            .collect();
        let valid = |g: usize, d: usize| -> bool {
            if d == 0 || !groups.mapped(g) {
                return true;
            }
            let need = groups.windows[g].map_or(d, |w| w.div_ceil(ps).min(d));
            runs[g][d - 1] >= need
        };
        let own: Vec<usize> = (0..g_count)
            .map(|g| (0..=n).rev().find(|&d| valid(g, d)).unwrap_or(0))
            .collect();
        let best = (0..=n)
            .rev()
            .find(|&d| (0..g_count).all(|g| valid(g, d)))
            .unwrap_or(0);
        let primary_own = if groups.mapped(0) { own[0] } else { n };
        // A windowed primary's plain miss: the page after the hit is not cached at all.
        let primary_ends = groups.mapped(0)
            && keys
                .get(best)
                .map_or(true, |key| groups.lookup(0, key).is_none());
        let reason = if best >= bound {
            HitReason::Full
        } else if best == n && !groups.mapped(0) || primary_ends {
            HitReason::PrimaryMiss
        } else if (0..g_count)
            .any(|g| groups.windows[g].is_some() && own[g] < primary_own.max(best + 1))
        {
            HitReason::WindowPagesMissing
        } else {
            HitReason::GroupPagesMissing
        };
        let per_group = groups
            .to_internal
            .iter()
            .map(|&g| if g == 0 { primary_own } else { own[g] } * ps)
            .collect();
        (best, keys, per_group, reason)
    }

    /// What a TTL pin of `tokens`' cached prefix holds in the group caches, as
    /// `(hit, point, pages)`: the prefix's hit (in pages); where the pin ends (the key of page
    /// `point - 1` names it; the tree pin's end, the tree's whole match, on a full primary, else
    /// the hit: one pin, made and removed at once in the tree and the group caches); and the pages
    /// the hit needs in each group cache (the last `ceil(W / page_size)` pages before it for a
    /// window, all for a full group; on an all-window manager also the page that ends a public
    /// prefix below the namespace's own pages, which says where the public part ends), so that the
    /// hit, not only the tree's pages, survives eviction while the pin lasts.
    pub(super) fn group_pin_plan(
        &self,
        st: &State,
        ns: Namespace,
        tokens: &[u32],
    ) -> (usize, Option<PageKey>, Vec<PageId>) {
        let ps = self.page_size;
        let groups = &st.groups;
        let (hit, keys, _, _) = self.peek_group_hit(st, ns, tokens);
        let point = if groups.primary_windowed() {
            hit
        } else {
            st.tree.peek_prefix_len(ns, tokens).min(keys.len())
        };
        let mut pages = Vec::new();
        for g in 0..groups.num_groups() {
            if !groups.mapped(g) {
                continue;
            }
            let need = groups.windows[g].map_or(hit, |w| w.div_ceil(ps).min(hit));
            pages.extend(
                keys[hit - need..hit]
                    .iter()
                    .filter_map(|key| groups.lookup(g, key)),
            );
            if g == 0 && need < hit && ns != PUBLIC_NAMESPACE {
                let public_end = keys[..hit - need].iter().rposition(|key| {
                    groups
                        .lookup(0, key)
                        .is_some_and(|p| groups.entries[&p].ns == PUBLIC_NAMESPACE)
                });
                if let Some(at) = public_end {
                    pages.extend(groups.lookup(0, &keys[at]));
                }
            }
        }
        (hit, point.checked_sub(1).map(|i| keys[i]), pages)
    }

    /// Admission on a manager with KV-cache groups, or of a streaming sequence; see
    /// [`add_sequence_with`](Self::add_sequence_with).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_sequence_bounded(
        &self,
        st: &mut State,
        seq_id: SeqId,
        prompt: Vec<u32>,
        namespace: Option<&str>,
        priority: i32,
        cache_prompt: bool,
        reserve: Option<usize>,
        streaming: Option<(usize, usize)>,
        now: u64,
    ) -> KvResult<Option<usize>> {
        let ps = self.page_size;
        let len = prompt.len();
        let known = st.known_namespace(namespace);
        let lookup_ns = known.unwrap_or(super::namespace::UNSEEN_NAMESPACE);
        let lookup = &prompt[..len - 1];
        st.tree.expire_pins(now);
        st.groups.expire_pins(now);
        let (hit, keys, per_group, reason) = self.peek_group_hit(st, lookup_ns, lookup);
        let slots = match reserve {
            None => len,
            Some(r) => hit * ps + r.min(len - hit * ps),
        };
        let num_pages = slots.div_ceil(ps);
        let g_count = st.groups.num_groups();
        let mut bounds = Bounds {
            computed: hit * ps,
            cursor: vec![0; g_count],
            streaming: streaming.map(|(sink, recent)| (sink.div_ceil(ps), recent)),
            // A streaming sequence shares its hit, never its own pages: once it releases a
            // page, what it computes differs from a full-context computation.
            private_from: streaming.map(|_| hit * ps),
            hit: Some(PrefixHit {
                num_tokens: hit * ps,
                group_tokens: per_group,
                reason,
            }),
        };
        // Which hit pages each mapped group takes: those still needed at `computed`.
        let mut taken: Vec<Vec<PageId>> = vec![Vec::new(); g_count];
        let mut evictable_taken = 0;
        for (g, t) in taken.iter_mut().enumerate() {
            let w = st.groups.windows[g];
            let start = bounds.start(w);
            let limit = bounds.limit(w, ps, bounds.computed).max(start).min(hit);
            if !st.groups.mapped(g) {
                // The tree's group takes the whole match (its path is locked): the pages it no
                // longer needs are released from its table by `drop_bounded`, from `start` on.
                bounds.cursor[g] = start;
                continue;
            }
            bounds.cursor[g] = limit;
            t.resize(hit, NULL_PAGE);
            for (i, slot) in t.iter_mut().enumerate() {
                if i >= start && i < limit {
                    continue;
                }
                let page = st.groups.lookup(g, &keys[i]).ok_or_else(|| {
                    internal(KvError::Internal(format!("group {g} lost hit page {i}")))
                })?;
                // Only what `num_evictable` counts (a pinned idle page is not evictable).
                let e = &st.groups.entries[&page];
                if e.users == 0 && e.pin_ref == 0 {
                    evictable_taken += 1;
                }
                *slot = page;
            }
        }
        let tree_hit = if st.groups.primary_windowed() { 0 } else { hit };
        let (_, tree_evictable) = st.tree.peek_prefix(lookup_ns, &lookup[..tree_hit * ps]);
        let fresh = g_count * (num_pages - hit);
        let room = self.alloc.num_free()
            + st.tree.num_evictable_pages().saturating_sub(tree_evictable)
            + st.groups.num_evictable().saturating_sub(evictable_taken);
        if fresh > room {
            st.stats.num_refused += 1;
            return Ok(None);
        }
        // Take the hit: the tree path (locked) and the mapped groups' pages (held), so that the
        // allocation below cannot evict them.
        let mut primary = Vec::with_capacity(num_pages);
        let matched = st.tree.match_prefix(
            lookup_ns,
            &lookup[..tree_hit * ps],
            priority,
            now,
            &mut primary,
        );
        debug_assert_eq!(matched.num_pages, tree_hit);
        st.tree.lock(matched.node).map_err(internal)?;
        let ns = st.resolve_namespace(known, namespace);
        st.add_live(ns);
        for t in &taken {
            for p in live(t) {
                st.groups.on_retain(p);
            }
        }
        let mut fresh_pages = Vec::with_capacity(fresh);
        if !self.allocate(st, fresh, now, &mut fresh_pages) {
            for t in &taken {
                for p in live(t) {
                    st.groups.on_release(p);
                }
            }
            st.tree.unlock(matched.node).map_err(internal)?;
            st.remove_live(ns);
            st.stats.num_refused += 1;
            return Ok(None);
        }
        self.alloc
            .retain_serialized(&primary[..tree_hit])
            .map_err(internal)?;
        for t in &taken {
            let held: Vec<PageId> = live(t).collect();
            self.alloc.retain_serialized(&held).map_err(internal)?;
        }
        let per_table = num_pages - hit;
        let mut tables: Vec<Vec<PageId>> = Vec::with_capacity(g_count);
        for (g, t) in taken.into_iter().enumerate() {
            let mut table = if st.groups.mapped(g) {
                t
            } else {
                std::mem::take(&mut primary)
            };
            table.extend_from_slice(&fresh_pages[g * per_table..(g + 1) * per_table]);
            tables.push(table);
        }
        st.stats.prefix_query_tokens += len as u64;
        st.stats.prefix_hit_tokens += (hit * ps) as u64;
        let mut tables = tables.into_iter();
        let pages = tables.next().unwrap_or_default();
        let mrc = if st.mrc.is_some() {
            let public = st.tree.public_pages(matched.node);
            let caches = cache_prompt && streaming.is_none();
            self.mrc_lookup(st, namespace, (public, hit), &prompt, caches)
        } else {
            Default::default()
        };
        let seq = Sequence {
            ns,
            priority,
            tokens: prompt,
            slots,
            pages,
            extra: tables.collect(),
            num_inserted_pages: hit,
            auto_cache: cache_prompt,
            num_committed: hit * ps,
            node: matched.node,
            lock_pages: tree_hit,
            loading: None,
            hit: vec![hit * ps],
            keys: keys[..hit.min(keys.len())].to_vec(),
            bounds: Some(Box::new(bounds)),
            copies: Vec::new(),
            mrc,
        };
        st.seqs.insert(seq_id, seq);
        // A streaming sequence admitted past its recent window releases the middle of its hit
        // now (the primary's cached pages stay locked by its path until it ends).
        self.prepare_bounds(st, seq_id, hit * ps)?;
        if cache_prompt {
            let full = slots.min(len) / ps;
            self.cache_full_pages(st, seq_id, full, now)?;
        }
        self.drop_bounded(st, seq_id)?;
        Ok(Some(hit * ps))
    }

    /// Record that `seq_id` has `computed` tokens computed; if a full-attention group is about to
    /// lose a page, the sequence's later pages become private first.
    pub(super) fn prepare_bounds(
        &self,
        st: &mut State,
        seq_id: SeqId,
        computed: usize,
    ) -> KvResult<()> {
        let ps = self.page_size;
        let windows = &st.groups.windows;
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let Some(b) = seq.bounds.as_deref_mut() else {
            return Ok(());
        };
        b.computed = b.computed.max(computed);
        if b.private_from.is_none() {
            let pages = seq.pages.len();
            let full_drop = windows.iter().enumerate().any(|(g, &w)| {
                w.is_none() && {
                    let start = b.start(w);
                    b.limit(w, ps, b.computed).min(pages) > b.cursor[g].max(start)
                }
            });
            if full_drop {
                b.private_from = Some(b.computed);
            }
        }
        Ok(())
    }

    /// Release the pages of `seq_id` that no query to come can read (see the module docs).
    pub(super) fn drop_bounded(&self, st: &mut State, seq_id: SeqId) -> KvResult<()> {
        let ps = self.page_size;
        // Split borrow: the windows are read while the sequence changes (no copy per append).
        let State { groups, seqs, .. } = &mut *st;
        let windows = &groups.windows;
        let seq = seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let Some(b) = seq.bounds.as_deref_mut() else {
            return Ok(());
        };
        let mut dropped = Vec::new();
        let computed = b.computed;
        for (g, &w) in windows.iter().enumerate() {
            let start = b.start(w);
            let from = b.cursor[g].max(start);
            let table = if g == 0 {
                &mut seq.pages
            } else {
                &mut seq.extra[g - 1]
            };
            let limit = b.limit(w, ps, computed).min(table.len());
            for slot in table.iter_mut().take(limit).skip(from) {
                dropped.push(std::mem::replace(slot, NULL_PAGE));
            }
            b.cursor[g] = b.cursor[g].max(limit);
        }
        if dropped.is_empty() {
            return Ok(());
        }
        self.release_table(st, &dropped)?;
        self.shrink_lock(st, seq_id)
    }

    /// Lock only the tree path `seq_id` still holds pages of: a released primary page past its
    /// last held cached page needs no lock (it stays cached, evictable).
    fn shrink_lock(&self, st: &mut State, seq_id: SeqId) -> KvResult<()> {
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if st.groups.primary_windowed() || seq.lock_pages == 0 {
            return Ok(());
        }
        let held = seq.pages[..seq.lock_pages]
            .iter()
            .rposition(|&p| p != NULL_PAGE)
            .map_or(0, |i| i + 1);
        if held < seq.lock_pages {
            let node = st.tree.cut_path(seq.node, held).map_err(internal)?;
            st.tree.lock(node).map_err(internal)?;
            st.tree.unlock(seq.node).map_err(internal)?;
            seq.node = node;
            seq.lock_pages = held;
            seq.num_inserted_pages = seq.num_inserted_pages.min(held);
            seq.keys.truncate(held);
        }
        Ok(())
    }

    /// Cache the full pages `[done, full)` of every mapped group of `seq_id` under their page
    /// keys (duplicates of pages cached already stay the sequence's own).
    pub(super) fn cache_group_pages(
        &self,
        st: &mut State,
        seq_id: SeqId,
        done: usize,
        full: usize,
    ) -> KvResult<()> {
        if full <= done {
            return Ok(());
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let (ns, node, lock_pages) = (seq.ns, seq.node, seq.lock_pages);
        let tokens = std::mem::take(&mut seq.tokens);
        let mut keys = std::mem::take(&mut seq.keys);
        keys.truncate(done.min(keys.len()));
        let mut path = Vec::new();
        if !st.groups.primary_windowed() {
            st.tree.path_pages(node, lock_pages, &mut path);
        }
        if keys.len() < done {
            keys.clear();
        }
        self.chain_keys(st, ns, &tokens, full, &path, &mut keys);
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.tokens = tokens;
        let mut adopt = Vec::new();
        // A windowed primary's newly cached pages (`(index, page)`): its KV events (the tree,
        // which reports the primary group otherwise, holds nothing then).
        let announce = st.events.is_some() && st.groups.primary_windowed();
        let mut announced: Vec<(usize, PageId)> = Vec::new();
        for g in 0..st.groups.num_groups() {
            if !st.groups.mapped(g) {
                continue;
            }
            let table = st.seqs[&seq_id].table(g);
            for i in done..full.min(keys.len()).min(table.len()) {
                let page = table[i];
                // A page keyed in another namespace than the sequence's (its tree path runs through
                // a public node there) stays its own: what one tenant computed is never served to
                // another under a public key.
                let foreign = path.get(i).is_some_and(|&(_, page_ns)| page_ns != ns);
                if page == NULL_PAGE
                    || foreign
                    || st.groups.entries.contains_key(&page)
                    || st.groups.lookup(g, &keys[i]).is_some()
                {
                    continue;
                }
                let owners = self.alloc.ref_count(page).map_err(internal)? - st.copy_holds(page);
                st.groups.entries.insert(
                    page,
                    Entry {
                        group: g as u8,
                        key: keys[i],
                        ns,
                        pin_ref: 0,
                        users: owners,
                        stamp: 0,
                    },
                );
                *st.groups.ns_pages.entry(ns).or_insert(0) += 1;
                *st.groups.group_ns_pages.entry((g as u8, ns)).or_insert(0) += 1;
                st.groups.by_key.insert((g as u8, keys[i]), page);
                adopt.push(page);
                if announce && g == 0 {
                    announced.push((i, page));
                }
            }
        }
        self.alloc.retain_serialized(&adopt).map_err(internal)?;
        // One event per run of consecutive pages.
        let mut runs = announced.chunk_by(|a, b| b.0 == a.0 + 1).peekable();
        if runs.peek().is_some() {
            let seq = &st.seqs[&seq_id];
            let tokens = seq.tokens.clone();
            for run in runs {
                let (first, last) = (run[0].0, run[run.len() - 1].0 + 1);
                let pages: Vec<PageId> = run.iter().map(|&(_, p)| p).collect();
                let parent = first.checked_sub(1).map(|j| keys[j]);
                let ps = self.page_size;
                let run_tokens = &tokens[first * ps..last * ps];
                self.record_group_stored(st, &keys[first..last], parent, &pages, run_tokens, ns);
            }
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.keys = keys;
        Ok(())
    }

    /// The original positions of the kept tokens of `seq_ids`' tables in caller group `group`,
    /// concatenated in batch order (int32, for kernels that read a compacted table; see
    /// [`page_table`](Self::page_table) with `compact`). Fails on an unknown id.
    pub fn positions(&self, seq_ids: &[SeqId], group: usize) -> KvResult<Vec<i32>> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let ps = self.page_size;
        /// The token ranges of the kept pages of `table` (a sequence of `n` tokens).
        fn kept(
            table: &[PageId],
            n: usize,
            ps: usize,
        ) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
            let pages = table.iter().enumerate().filter(|&(_, &p)| p != NULL_PAGE);
            pages.map(move |(i, _)| i * ps..((i + 1) * ps).min(n))
        }
        // Counted first, then had fallibly: repeated ids make the output as long as the caller asks.
        let mut total = 0usize;
        for &id in seq_ids {
            let seq = super::ready(&guard.seqs, id)?;
            total = kept(seq.table(g), seq.slots, ps).fold(total, |t, r| t.saturating_add(r.len()));
        }
        if total > i32::MAX as usize {
            return Err(KvError::InvalidArgument(format!(
                "positions: {total} kept tokens exceed int32"
            )));
        }
        let mut out = try_with_capacity(total, "the positions")?;
        for id in seq_ids {
            let seq = &guard.seqs[id];
            for range in kept(seq.table(g), seq.slots, ps) {
                out.extend(range.map(|t| t as i32));
            }
        }
        Ok(out)
    }

    /// The prefix hit `seq_id`'s admission got, per group, with the reason it is not longer.
    pub fn prefix_hit(&self, seq_id: SeqId) -> KvResult<PrefixHit> {
        let guard = self.state.lock();
        let seq = guard.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if let Some(hit) = seq.bounds.as_ref().and_then(|b| b.hit.clone()) {
            return Ok(hit);
        }
        let tokens = seq.hit[0];
        let bound = (seq.tokens.len().saturating_sub(1)) / self.page_size * self.page_size;
        Ok(PrefixHit {
            num_tokens: tokens,
            group_tokens: vec![tokens],
            reason: if tokens >= bound {
                HitReason::Full
            } else {
                HitReason::PrimaryMiss
            },
        })
    }

    /// Heavy-hitter compaction (H2O at page granularity): release the full-attention pages of
    /// `seq_id` with the lowest `scores` until it holds at most `max_pages` of them, never one of
    /// its first `sink_tokens` tokens' pages (or its own streaming sinks, if more) or of its last
    /// `recent_tokens` tokens' pages (its last page always stays). `scores` has one entry per page of the primary table
    /// ([`seq_pages`](Self::seq_pages), released ones included) or one per kept page in order
    /// (the compacted table the kernels read). Call it after the step whose attention produced the
    /// scores: the sequence's pages from then on are private (never cached). Returns the number of
    /// pages released; `InvalidArgument` (nothing changed) for a wrong length or a NaN score.
    pub fn compact(
        &self,
        seq_id: SeqId,
        scores: &[f32],
        max_pages: usize,
        sink_tokens: usize,
        recent_tokens: usize,
    ) -> KvResult<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let ps = self.page_size;
        let seq = super::ready(&st.seqs, seq_id)?;
        if st.groups.windows.iter().all(|w| w.is_some()) {
            return Err(KvError::InvalidArgument(
                "compact: every KV-cache group is a sliding window (their pages leave the window by \
                 themselves); compaction releases full-attention pages"
                    .into(),
            ));
        }
        let table = &seq.pages;
        let kept: Vec<usize> = (0..table.len())
            .filter(|&i| table[i] != NULL_PAGE)
            .collect();
        let by_page: Vec<f32> = if scores.len() == table.len() {
            scores.to_vec()
        } else if scores.len() == kept.len() {
            let mut v = vec![f32::INFINITY; table.len()];
            for (&i, &s) in kept.iter().zip(scores) {
                v[i] = s;
            }
            v
        } else {
            return Err(KvError::InvalidArgument(format!(
                "compact: sequence {seq_id} has {} pages ({} kept), got {} scores",
                table.len(),
                kept.len(),
                scores.len()
            )));
        };
        if scores.iter().any(|s| s.is_nan()) {
            return Err(KvError::InvalidArgument("compact: a score is NaN".into()));
        }
        if max_pages == 0 {
            return Err(KvError::InvalidArgument(
                "compact: max_pages must be >= 1 (free the sequence to drop it all)".into(),
            ));
        }
        // A streaming sequence's own sinks stay too (its attention needs them at every step).
        let own_sinks = seq
            .bounds
            .as_deref()
            .and_then(|b| b.streaming)
            .map_or(0, |(sinks, _)| sinks);
        let sinks = sink_tokens.div_ceil(ps).max(own_sinks);
        // Tokens computed (known and slotted): draft slots past them are not (a later append may
        // reject them).
        let n = seq.computable();
        let recent_from = n.saturating_sub(recent_tokens.max(1)) / ps;
        let mut candidates: Vec<usize> = kept
            .iter()
            .copied()
            .filter(|&i| i >= sinks && i < recent_from && i + 1 < table.len())
            .collect();
        let excess = kept.len().saturating_sub(max_pages);
        if excess == 0 || candidates.is_empty() {
            return Ok(0);
        }
        candidates.sort_by(|&a, &b| by_page[a].total_cmp(&by_page[b]).then(a.cmp(&b)));
        candidates.truncate(excess);
        let windows = st.groups.windows.clone();
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let b = seq.bounds.get_or_insert_with(|| {
            Box::new(Bounds {
                computed: n,
                cursor: vec![0; windows.len()],
                ..Bounds::default()
            })
        });
        b.computed = b.computed.max(n);
        b.private_from = Some(b.private_from.map_or(n, |p| p.min(n)));
        let mut dropped = Vec::with_capacity(candidates.len() * windows.len());
        for (g, w) in windows.iter().enumerate() {
            if w.is_some() {
                continue;
            }
            let table = seq.table_mut(g);
            for &i in &candidates {
                dropped.push(std::mem::replace(&mut table[i], NULL_PAGE));
            }
        }
        let count = candidates.len();
        self.release_table(st, &dropped)?;
        self.shrink_lock(st, seq_id)?;
        Ok(count)
    }

    /// Whether truncating `seq` to `n` tokens keeps every page a query at `n` or later reads:
    /// `InvalidArgument` otherwise (the window's or the recent tokens' pages were released).
    pub(super) fn check_truncate_bounds(
        &self,
        st: &State,
        seq_id: SeqId,
        seq: &Sequence,
        n: usize,
    ) -> KvResult<()> {
        let Some(b) = seq.bounds.as_deref() else {
            return Ok(());
        };
        let ps = self.page_size;
        for (g, &w) in st.groups.windows.iter().enumerate() {
            let start = b.start(w);
            let need_from = b.limit(w, ps, n).max(start);
            let last_needed = (n - 1) / ps;
            let table = seq.table(g);
            let released_needed = b.cursor[g] > need_from && (w.is_some() || b.streaming.is_some())
                || table.get(last_needed).is_some_and(|&p| p == NULL_PAGE);
            if released_needed {
                return Err(KvError::InvalidArgument(format!(
                    "sequence {seq_id}: cannot truncate to {n} tokens, pages that tokens from {n} \
                     on would read were released (window, streaming or compaction)"
                )));
            }
        }
        Ok(())
    }
}
