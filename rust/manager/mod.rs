//! The scheduler-facing KV-cache manager (F1, F3, F4, F5, F12): sequences, their page tables,
//! prefix sharing through the radix tree, copy-on-write for forks, eviction, and the honest
//! usage split.
//!
//! # Ownership (every page's `ref_cnt` equals its owners)
//! - The tree holds one reference on every page stored in it ([`RadixTree::insert`] adopts).
//! - Each live sequence holds one reference on every page of its page table.
//! - A sequence locks the deepest tree node covering its full pages, so its path is never evicted.
//!
//! A page is **in use** when a sequence holds it or a lock protects it, **cached** (evictable) when
//! only the tree holds it and nothing locks or pins it, **pinned** when a TTL pin protects it, and
//! **free** when the allocator has it; the four counts sum to the usable pages.
//!
//! # When prompts become shareable
//! By default `add_sequence` caches the prompt's full pages immediately and `append` caches each page
//! as it fills: the engine computes them in the same step (as vLLM's `allocate_slots` assumes), so a
//! request admitted afterwards can reuse them. An engine that computes a prompt over several steps
//! (chunked prefill) admits it with `cache_prompt = false` and calls `commit(seq_id, num_tokens)`
//! after each step: only computed pages are ever shared, and a sequence freed before its prefill
//! finished leaves nothing half-written in the cache.
//! At most `prompt_len - 1` tokens are reported cached, so the model always computes at least the
//! last prompt token (whose logits it needs); a fully cached page-aligned prompt recomputes its last
//! page into a fresh page.
//!
//! # Concurrency
//! Every call takes one internal mutex for its duration (the tree and the sequences are one state);
//! the allocator underneath stays lock-free. The manager's allocator is private and every
//! reference-count change on it happens under that mutex, so the manager uses the allocator's
//! `*_serialized` retain and free (plain loads and stores instead of one atomic read-modify-write
//! per page: the cost that dominated a prefix hit). Calls never run Python code or wait for the
//! interpreter while holding the mutex, so callers on several threads cannot deadlock.
//!
//! # Failure
//! Caller mistakes return `Err` before anything changes. Running out of pages returns `None` /
//! `false` with the sequences, the allocator and the cached pages unchanged: an admission that cannot
//! fit even after evicting everything evictable but its own matched prefix is refused before its
//! lookup touches anything (recency, hit counts and priorities included).

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use crate::allocator::PageAllocator;
use crate::error::{KvError, KvResult};
use crate::eviction::EvictionPolicy;
use crate::keys::{root_key, PageKey};
use crate::radix::{Namespace, NodeId, RadixTree, DEFAULT_NAMESPACE};
use crate::PageId;

mod copies;
mod events;
mod groups;
mod mrc;
mod namespace;
mod page_table;
mod prefix;
mod stats;
mod tiers;

pub use events::{KvEvent, MAX_EVENTS, MEDIUM_HBM};
pub use groups::{HitReason, PrefixHit, MAX_GROUPS};
pub use mrc::MrcReport;
use namespace::UNSEEN_NAMESPACE;
pub use page_table::{BatchLayout, PageTable};
pub use prefix::PrefixMatch;
pub use stats::CacheStats;
pub use tiers::{
    LoadRow, RestoreOutcome, RestoredPage, StorePolicy, StoreRow, TierConfig, TierStats,
    TransferBatch, ValueModel,
};

/// Largest page size: `kv_last_page_len` is int32, and no engine uses pages of more tokens.
pub const MAX_PAGE_SIZE: usize = 1 << 20;

/// A sequence id chosen by the caller.
pub type SeqId = i64;

/// Live sequences by id. Fx hashing: ids come from the engine (not from clients), and every call
/// looks one up, a decode step hundreds.
type SeqMap = HashMap<SeqId, Sequence, crate::radix::FxBuildHasher>;

/// A tenant's (floor, ceiling) in one tree: pages kept while others can go, pages past which its
/// own go first (`None`: no ceiling).
type TenantQuota = (usize, Option<usize>);

/// The namespace name that is visible from every namespace (prefixes declared public).
pub const PUBLIC_NAMESPACE_NAME: &str = "*";

/// How to build a [`KVCacheManager`].
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Pages in the pool, the null page included (`num_pages - 1` usable).
    pub num_pages: usize,
    /// Tokens per page, > 0.
    pub page_size: usize,
    /// Which cached pages go first.
    pub policy: EvictionPolicy,
    /// Most pages TTL pins may cover (None: unlimited).
    pub pin_budget_pages: Option<usize>,
    /// What makes two caches' K/V interchangeable (model id, KV dtype, page size, layout,
    /// version): the seed of every page key (see [`crate::keys`]).
    pub fingerprint: Vec<u8>,
    /// Record KV events for routers ([`KVCacheManager::take_events`]).
    pub events: bool,
    /// Lower tiers under HBM, fastest first (see [`tiers`](self#lower-tiers)).
    pub lower_tiers: Vec<TierConfig>,
    /// Which pages are stored to the lower tiers.
    pub store_policy: StorePolicy,
    /// KV-cache groups of layers, each with its own page table per sequence: `None` for full
    /// attention, `Some(w)` for a sliding window of `w` tokens (see [`groups`]). Empty: one
    /// full-attention group.
    pub groups: Vec<Option<usize>>,
}

/// One live sequence.
#[derive(Clone, Debug)]
struct Sequence {
    ns: Namespace,
    priority: i32,
    /// Every token known so far (prompt + appended), `[len]`.
    tokens: Vec<u32>,
    /// Leading tokens with a slot reserved (`<= len`: the rest of the prompt is reserved later,
    /// chunk by chunk, with `reserve`).
    slots: usize,
    /// The page table, `[ceil(slots / page_size)]`.
    pages: Vec<PageId>,
    /// Leading full pages already offered to the tree.
    num_inserted_pages: usize,
    /// Whether full pages are cached as they are reserved (`add_sequence`/`append`), or only when
    /// the engine says they are computed (`commit`, for chunked prefill).
    auto_cache: bool,
    /// Tokens the engine said it computed (`commit`); every token when `auto_cache`.
    num_committed: usize,
    /// The deepest tree node this sequence locks (`radix::ROOT`: none).
    node: NodeId,
    /// Pages from the root to the end of `node`: `num_inserted_pages`, or one more after a
    /// `truncate` into a cached page (which the sequence still holds and must keep locked until
    /// its next write copies it).
    lock_pages: usize,
    /// Loads from lower tiers in flight for this admission (`None`: ready).
    loading: Option<tiers::Loading>,
    /// Prefix hit tokens per medium: `[HBM, tier 0, ...]`.
    hit: Vec<usize>,
    /// Page keys of the leading full pages, computed when a lower tier needs them.
    keys: Vec<PageKey>,
    /// Tables of the other KV-cache groups (internal order from 1), each like `pages`.
    extra: Vec<Vec<PageId>>,
    /// Windows, streaming and compaction state (`None`: an unbounded sequence).
    bounds: Option<Box<groups::Bounds>>,
    /// Page ranges `[start, end)` the tree already had when the sequence offered its own copies
    /// (a fully cached page-aligned prompt recomputes its last page; two sequences computing the
    /// same prefix): once the sequence's copies are computed, the tree takes them and frees its
    /// own (see [`adopt_copies`](KVCacheManager::adopt_copies)).
    copies: Vec<(usize, usize)>,
    /// Where its miss-ratio curve keys stand (unused when the curve is off).
    mrc: mrc::MrcCursor,
}

impl Sequence {
    /// Whether the engine has computed every token (so its pages may be shared by a fork).
    fn fully_computed(&self) -> bool {
        self.slots >= self.tokens.len()
            && (self.auto_cache || self.num_committed >= self.tokens.len())
    }

    /// Leading tokens both known and slotted: those the engine can have computed.
    fn computable(&self) -> usize {
        self.slots.min(self.tokens.len())
    }
}

#[derive(Debug)]
struct State {
    tree: RadixTree,
    seqs: SeqMap,
    /// Interned namespace names (`None` is [`DEFAULT_NAMESPACE`]), kept only while the namespace
    /// has a live sequence or a cached page (see [`State::forget_if_unused`]).
    namespaces: HashMap<String, Namespace>,
    /// The reverse of `namespaces`.
    namespace_names: HashMap<Namespace, String>,
    /// Live sequences per interned namespace (entries at zero are removed).
    namespace_seqs: HashMap<Namespace, usize>,
    /// Tenant floors by (namespace name, `None`: the default namespace; lower tier index,
    /// `None`: HBM), applied to that tier's tree whenever the name is interned.
    tenant_floors: HashMap<(Option<String>, Option<usize>), TenantQuota>,
    /// The next namespace id: ids are never reused, so a forgotten name never aliases a new one.
    next_namespace: Namespace,
    stats: CacheStats,
    /// `(src_page, dst_page)` copies the pool must perform before the next kernel writes. Each
    /// source is held (one allocator reference per pair) until the pair is taken or cancelled, so
    /// it is never reused meanwhile; a pair whose destination loses its last owner is cancelled
    /// at once. Sources and destinations are disjoint and destinations distinct (see `queue_copy`).
    pending_copies: Vec<(PageId, PageId)>,
    /// References held by the caller on pages it took with `allocate_pages` (to load K/V into
    /// and `insert`), per page.
    caller_held: HashSet<PageId>,
    /// `(node, source)`: tree nodes locked because the source page of a queued copy, on their
    /// path, was cached (released when that source's copies are taken or cancelled).
    copy_locks: Vec<(NodeId, PageId)>,
    /// Scratch for evicted pages.
    evicted: Vec<PageId>,
    /// Scratch for namespaces emptied by an eviction.
    emptied: Vec<Namespace>,
    /// The KV event log, when events are on.
    events: Option<events::Events>,
    /// Lower tiers, fastest first.
    tiers: Vec<tiers::Tier>,
    store_policy: StorePolicy,
    /// Transfers queued and in flight.
    transfers: tiers::Transfers,
    /// The KV-cache groups and the cache of the non-primary groups' pages.
    groups: groups::Groups,
    /// The miss-ratio curve, when on ([`KVCacheManager::set_miss_ratio_curve`]).
    mrc: Option<Box<crate::mrc::MissRatioCurve>>,
    /// Scratch for the curve's page keys.
    mrc_keys: Vec<u64>,
}

/// The KV-cache manager. Every method takes `&self`; see the module docs for concurrency.
#[derive(Debug)]
pub struct KVCacheManager {
    alloc: PageAllocator,
    page_size: usize,
    /// The root page key, from the configuration's fingerprint.
    root_key: PageKey,
    state: Mutex<State>,
}

/// A core call that cannot fail unless kvcore itself is broken failed: report it as
/// [`KvError::Internal`] (never as the caller's mistake), and stop debug builds right there.
fn internal(err: KvError) -> KvError {
    debug_assert!(false, "internal invariant broken: {err}");
    KvError::Internal(format!(
        "kvcore invariant broken ({err}); please report this with the calls that led to it"
    ))
}

impl KVCacheManager {
    /// A manager over a fresh pool.
    pub fn new(config: ManagerConfig) -> KvResult<Self> {
        if config.page_size > MAX_PAGE_SIZE
            || (config.num_pages as u128) * (config.page_size as u128) > i64::MAX as u128
        {
            return Err(KvError::InvalidArgument(format!(
                "page_size must be in 1..={MAX_PAGE_SIZE} and num_pages * page_size must fit int64 (slots), \
                 got {} pages of {}",
                config.num_pages, config.page_size
            )));
        }
        let mut names = HashSet::new();
        for t in &config.lower_tiers {
            if t.name.is_empty()
                || t.name.eq_ignore_ascii_case("hbm")
                || !names.insert(t.name.as_str())
            {
                return Err(KvError::InvalidArgument(format!(
                    "lower tier names must be distinct, non-empty and not \"hbm\" in any case (the \
                     first tier's name in hits, floors and metrics), got {:?}",
                    t.name
                )));
            }
            if t.num_slots == 0 || t.num_slots >= u32::MAX as usize {
                return Err(KvError::InvalidArgument(format!(
                    "lower tier {:?}: num_slots must be in 1..={}, got {}",
                    t.name,
                    u32::MAX - 1,
                    t.num_slots
                )));
            }
            if !(t.bandwidth_gbps.is_finite() && t.bandwidth_gbps > 0.0) {
                return Err(KvError::InvalidArgument(format!(
                    "lower tier {:?}: bandwidth_gbps must be finite and > 0, got {}",
                    t.name, t.bandwidth_gbps
                )));
            }
        }
        if config.lower_tiers.len() > 255 {
            return Err(KvError::InvalidArgument("at most 255 lower tiers".into()));
        }
        check_store_policy(&config.store_policy)?;
        let groups = groups::Groups::new(&config.groups)?;
        if groups.active() && !config.lower_tiers.is_empty() {
            return Err(KvError::InvalidArgument(
                "lower tiers with sliding-window or several KV-cache groups are not supported \
                 yet: use one full-attention group, or no lower tiers"
                    .into(),
            ));
        }
        let tiers = config
            .lower_tiers
            .iter()
            .map(|t| tiers::Tier::new(t.clone(), config.page_size))
            .collect::<KvResult<Vec<_>>>()?;
        let alloc = PageAllocator::new(config.num_pages)?;
        let mut tree = RadixTree::new(config.page_size, config.policy)?;
        if let Some(budget) = config.pin_budget_pages {
            tree.set_pin_budget_pages(budget);
        }
        Ok(Self {
            alloc,
            page_size: config.page_size,
            root_key: root_key(&config.fingerprint),
            state: Mutex::new(State {
                tree,
                seqs: SeqMap::default(),
                namespaces: HashMap::new(),
                namespace_names: HashMap::new(),
                namespace_seqs: HashMap::new(),
                tenant_floors: HashMap::new(),
                next_namespace: DEFAULT_NAMESPACE + 1,
                stats: CacheStats {
                    num_pages_total: config.num_pages - 1,
                    ..CacheStats::default()
                },
                pending_copies: Vec::new(),
                caller_held: HashSet::new(),
                copy_locks: Vec::new(),
                evicted: Vec::new(),
                emptied: Vec::new(),
                events: config.events.then(events::Events::default),
                tiers,
                store_policy: config.store_policy,
                transfers: tiers::Transfers::default(),
                groups,
                mrc: None,
                mrc_keys: Vec::new(),
            }),
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool, the null page included.
    pub fn num_pages(&self) -> usize {
        self.alloc.num_pages()
    }

    /// References held on `page` (0 when free): the tree's and each sequence's. Read without the
    /// manager's lock: while another thread's call is in flight it may show a batch half applied.
    pub fn ref_count(&self, page: PageId) -> KvResult<u32> {
        self.alloc.ref_count(page)
    }

    /// Admit a sequence: take the longest cached prefix of `prompt` (whole pages, at most
    /// `len - 1` tokens), lock it, allocate the rest (evicting unlocked cached pages if needed) and,
    /// if `cache_prompt`, cache the prompt's full pages (the engine computes them in this step).
    /// With `cache_prompt == false` (chunked prefill) pages are cached only by [`commit`](Self::commit).
    /// Returns the number of prompt tokens already cached, or `None` (nothing changed) if the pages
    /// cannot be found even after evicting everything evictable. An owned `prompt` (a `Vec`) is
    /// kept as the sequence's tokens without a copy.
    pub fn add_sequence<P: AsRef<[u32]> + Into<Vec<u32>>>(
        &self,
        seq_id: SeqId,
        prompt_tokens: P,
        namespace: Option<&str>,
        priority: i32,
        cache_prompt: bool,
        now: u64,
    ) -> KvResult<Option<usize>> {
        self.add_sequence_with(
            seq_id,
            prompt_tokens,
            namespace,
            priority,
            cache_prompt,
            None,
            None,
            now,
        )
    }

    /// [`add_sequence`](Self::add_sequence) reserving slots for only the first `reserve` prompt
    /// tokens after the cached prefix (`None`: all of them); the rest is reserved chunk by chunk
    /// with [`reserve`](Self::reserve). With `cache_prompt = false` and
    /// [`commit`](Self::commit), this is vLLM's `allocate_slots(num_new_tokens)`.
    ///
    /// Optionally as a StreamingLLM sequence: `streaming = Some((sink_tokens, recent_tokens))` keeps, in every full-attention
    /// group, the pages of its first `sink_tokens` tokens and of its last `recent_tokens` tokens,
    /// and releases the pages between them as it grows (see [`groups`]). `InvalidArgument`
    /// (nothing changed) for `recent_tokens == 0` or a manager with lower tiers.
    #[allow(clippy::too_many_arguments)]
    pub fn add_sequence_with<P: AsRef<[u32]> + Into<Vec<u32>>>(
        &self,
        seq_id: SeqId,
        prompt_tokens: P,
        namespace: Option<&str>,
        priority: i32,
        cache_prompt: bool,
        reserve: Option<usize>,
        streaming: Option<(usize, usize)>,
        now: u64,
    ) -> KvResult<Option<usize>> {
        let prompt = prompt_tokens.as_ref();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.seqs.contains_key(&seq_id) {
            return Err(KvError::DuplicateSequence(format!(
                "sequence {seq_id} already exists"
            )));
        }
        if prompt.is_empty() {
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id}: the prompt is empty"
            )));
        }
        if let Some((_, recent)) = streaming {
            if recent == 0 || !st.tiers.is_empty() {
                return Err(KvError::InvalidArgument(format!(
                    "sequence {seq_id}: streaming needs recent_tokens >= 1 (got {recent}) and a \
                     manager without lower tiers"
                )));
            }
        }
        if st.groups.active() || streaming.is_some() {
            return self.add_sequence_bounded(
                st,
                seq_id,
                prompt_tokens.into(),
                namespace,
                priority,
                cache_prompt,
                reserve,
                streaming,
                now,
            );
        }
        // A name not interned yet sees only the public prefixes; it is interned once admitted, so
        // a refused admission leaves nothing behind.
        let known = st.known_namespace(namespace);
        let lookup_ns = known.unwrap_or(UNSEEN_NAMESPACE);
        let ps = self.page_size;
        let len = prompt.len();
        // Slots the admission reserves once `hit_pages` are found cached.
        let slots_for = |hit_pages: usize| match reserve {
            None => len,
            Some(r) => hit_pages * ps + r.min(len - hit_pages * ps),
        };
        let lookup = &prompt[..len - 1];
        if reserve.is_some() || len.div_ceil(ps) > self.alloc.num_free() {
            // The pool may be short: refuse now if even evicting everything evictable cannot make
            // room, before the lookup touches recency, hit counts or priorities.
            // Exact: the matched prefix's own evictable pages are locked by this admission, so
            // they cannot make room for it.
            st.tree.expire_pins(now);
            let (hit_pages, hit_evictable) = st.tree.peek_prefix(lookup_ns, lookup);
            // Pages a lower tier holds after the HBM hit need fresh HBM pages to load into.
            let loads = if st.tiers.is_empty() {
                0
            } else {
                self.plan_loads(st, lookup_ns, lookup, hit_pages).len()
            };
            let need = slots_for(hit_pages + loads).div_ceil(ps) - hit_pages;
            let room = self.alloc.num_free() + st.tree.num_evictable_pages() - hit_evictable;
            if need > room {
                st.stats.num_refused += 1;
                return Ok(None);
            }
        }
        let mut pages = Vec::with_capacity(len.div_ceil(ps));
        let hit = st
            .tree
            .match_prefix(lookup_ns, lookup, priority, now, &mut pages);
        // The pages after the HBM hit that lower tiers hold: loaded into fresh pages.
        let plan = if st.tiers.is_empty() {
            Vec::new()
        } else {
            self.plan_loads(st, lookup_ns, lookup, hit.num_pages)
        };
        let total_hit = hit.num_pages + plan.len();
        let slots = slots_for(total_hit);
        let num_pages = slots.div_ceil(ps);
        st.tree.lock(hit.node).map_err(internal)?;
        // The namespace counts the sequence as live before the allocation, whose evictions could
        // otherwise drop the namespace's last node and forget its name under this admission.
        let ns = st.resolve_namespace(known, namespace);
        st.add_live(ns);
        if !self.allocate(st, num_pages - hit.num_pages, now, &mut pages) {
            st.tree.unlock(hit.node).map_err(internal)?;
            st.remove_live(ns); // a name interned for this admission is forgotten again
            st.stats.num_refused += 1;
            return Ok(None);
        }
        // The sequence's own references on the pages it shares with the tree.
        self.alloc
            .retain_serialized(&pages[..hit.num_pages])
            .map_err(internal)?;
        st.stats.prefix_query_tokens += prompt.len() as u64;
        st.stats.prefix_hit_tokens += (hit.num_pages * ps) as u64;
        let full_pages = slots.min(len) / ps;
        let loading = if plan.is_empty() {
            None
        } else {
            Some(self.queue_loads(
                st,
                seq_id,
                lookup_ns,
                lookup,
                hit.num_pages,
                &plan,
                &pages,
                priority,
                st.tree.public_pages(hit.node) == hit.num_pages,
                now,
            )?)
        };
        let mut hit_tokens = vec![0; 1 + st.tiers.len()];
        hit_tokens[0] = hit.num_pages * ps;
        for &t in &plan {
            hit_tokens[1 + t as usize] += ps;
        }
        let mrc = if st.mrc.is_some() {
            let public = st.tree.public_pages(hit.node);
            self.mrc_lookup(st, namespace, (public, hit.num_pages), prompt, cache_prompt)
        } else {
            mrc::MrcCursor::default()
        };
        // The sequence starts with the matched prefix cached and its node locked (the lock taken
        // above becomes the sequence's); its own full pages join the tree like appended ones.
        st.seqs.insert(
            seq_id,
            Sequence {
                ns,
                priority,
                tokens: prompt_tokens.into(),
                slots,
                pages,
                num_inserted_pages: hit.num_pages,
                auto_cache: cache_prompt,
                // The matched prefix is computed already (cached K/V).
                num_committed: hit.num_pages * ps,
                node: hit.node,
                lock_pages: hit.num_pages,
                loading,
                hit: hit_tokens,
                keys: Vec::new(),
                extra: Vec::new(),
                bounds: None,
                copies: Vec::new(),
                mrc,
            },
        );
        if hit.num_pages > 0 {
            self.offer_seq_stores(st, seq_id, hit.num_pages, tiers::Trigger::Hit, now)?;
        }
        // A sequence loading its prefix caches its pages once the loads complete.
        if cache_prompt && plan.is_empty() {
            self.cache_full_pages(st, seq_id, full_pages, now)?;
        }
        Ok(Some(total_hit * ps))
    }

    /// Reserve slots for `tokens` generated by `seq_id`. Pages that become full are cached. A shared
    /// partially filled last page is copied first (copy-on-write; see
    /// [`take_pending_copies`](Self::take_pending_copies)). `false` (nothing changed) if no room.
    pub fn append(&self, seq_id: SeqId, tokens: &[u32], now: u64) -> KvResult<bool> {
        self.append_with_lookahead(seq_id, tokens, 0, now)
    }

    /// [`append`](Self::append), also reserving `num_lookahead` slots after the new tokens for
    /// draft tokens (speculative decoding): the engine writes the drafts' K/V there, appends the
    /// accepted ones as tokens and [`truncate`](Self::truncate)s to reject. Every existing page
    /// the step writes (the new tokens' and the drafts') that another owner shares is replaced by
    /// a private copy first (copy-on-write). `false` (nothing changed) if there is no room.
    pub fn append_with_lookahead(
        &self,
        seq_id: SeqId,
        tokens: &[u32],
        num_lookahead: usize,
        now: u64,
    ) -> KvResult<bool> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        check_appendable(&st.seqs, seq_id)?;
        self.append_locked(st, seq_id, tokens, num_lookahead, now)
    }

    /// One generated token for each of `seq_ids` (`tokens[i]` to `seq_ids[i]`), in order, as
    /// [`append`](Self::append) would, under one lock: a scheduler's decode step. Stops at the
    /// first sequence that finds no room and returns how many were appended (the ones before it;
    /// nothing changed for it or after it). `InvalidArgument` / `UnknownSequence` (nothing changed
    /// at all) for lengths that differ, an id listed twice, or an id `append` would refuse.
    pub fn append_batch(&self, seq_ids: &[SeqId], tokens: &[u32], now: u64) -> KvResult<usize> {
        if seq_ids.len() != tokens.len() {
            return Err(KvError::InvalidArgument(format!(
                "append_batch: {} sequence ids for {} tokens",
                seq_ids.len(),
                tokens.len()
            )));
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut seen = std::collections::HashSet::with_capacity_and_hasher(
            seq_ids.len(),
            crate::radix::FxBuildHasher::default(),
        );
        for &id in seq_ids {
            check_appendable(&st.seqs, id)?;
            if !seen.insert(id) {
                return Err(KvError::InvalidArgument(format!(
                    "append_batch: sequence {id} is listed twice"
                )));
            }
        }
        for (i, (&id, &token)) in seq_ids.iter().zip(tokens).enumerate() {
            if !self.append_locked(st, id, &[token], 0, now)? {
                return Ok(i);
            }
        }
        Ok(seq_ids.len())
    }

    /// [`append_with_lookahead`](Self::append_with_lookahead) once `seq_id` passed
    /// [`check_appendable`]. Each call reserves exactly `num_lookahead` draft slots past the new
    /// tokens: slots of an earlier call's drafts past them are released (they held rejected or
    /// unused drafts), so the tables never cover stale slots.
    fn append_locked(
        &self,
        st: &mut State,
        seq_id: SeqId,
        tokens: &[u32],
        num_lookahead: usize,
        now: u64,
    ) -> KvResult<bool> {
        let seq = ready(&st.seqs, seq_id)?;
        let ps = self.page_size;
        let old_len = seq.tokens.len();
        let new_len = old_len + tokens.len();
        // Pages offered before this call are computed (appending says the old tokens are).
        let computed_copies = seq.copies.len();
        if tokens.is_empty() && num_lookahead == 0 && seq.slots == old_len {
            return Ok(true);
        }
        // Refused before anything is sized by the caller's counts: more slots than the whole pool
        // holds can never be had (`false`, as for any lack of room). A full-attention group holds
        // every page of the sequence; when every group is windowed only the pages this call adds
        // count (the ones its window left are released), so such a sequence grows without end.
        let usable = self.alloc.num_pages() - 1;
        let held_before = if st.groups.primary_windowed() {
            seq.pages.len()
        } else {
            0
        };
        let slots = match new_len.checked_add(num_lookahead) {
            Some(end) if end.div_ceil(ps).saturating_sub(held_before) <= usable => end,
            _ => {
                st.stats.num_refused += 1;
                return Ok(false);
            }
        };
        let keep_pages = slots.div_ceil(ps);
        let grow = keep_pages.saturating_sub(seq.pages.len());
        let num_tables = 1 + seq.extra.len();
        // Existing pages this step writes, from the one holding slot `old_len`; shared ones (a
        // queued copy's hold on its source does not count: the copy reads the page before this
        // step's kernels write it) get a private copy. In every group's table: `(group, index)`.
        let written = old_len / ps..seq.pages.len().min((new_len + num_lookahead).div_ceil(ps));
        let mut cow = Vec::new();
        for g in 0..num_tables {
            for i in written.clone() {
                let page = seq.table(g)[i];
                if page == crate::NULL_PAGE {
                    continue;
                }
                let owners = self.alloc.ref_count(page).map_err(internal)? - st.copy_holds(page);
                if owners > 1 {
                    cow.push((g, i));
                }
            }
        }
        let fresh_count = grow * num_tables;
        let mut fresh = Vec::with_capacity(fresh_count + cow.len());
        if !self.allocate(st, fresh_count + cow.len(), now, &mut fresh) {
            st.stats.num_refused += 1;
            return Ok(false);
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let copies: Vec<(PageId, PageId)> = cow
            .iter()
            .zip(&fresh[fresh_count..])
            .map(|(&(g, i), &copy)| (std::mem::replace(&mut seq.table_mut(g)[i], copy), copy))
            .collect();
        let mut stale = Vec::new();
        for (g, more) in fresh[..fresh_count].chunks(grow.max(1)).enumerate() {
            seq.table_mut(g).extend_from_slice(more);
        }
        for g in 0..num_tables {
            // Pages past the slots kept held only draft slots of an earlier call: never cached.
            let table = seq.table_mut(g);
            if table.len() > keep_pages {
                stale.extend(table.split_off(keep_pages));
            }
        }
        seq.tokens.extend_from_slice(tokens);
        seq.slots = slots;
        // A truncate left the sequence locking the cached page it writes into now: the sequence
        // gets its own copy and locks only its cached pages again, while the old lock passes to
        // the queued copy (the cached page it reads must not be evicted before the copy is taken).
        let relock =
            seq.lock_pages > seq.num_inserted_pages && cow.contains(&(0, seq.num_inserted_pages));
        let mut released_lock = None;
        if relock {
            let node = st
                .tree
                .cut_path(seq.node, seq.num_inserted_pages)
                .map_err(internal)?;
            st.tree.lock(node).map_err(internal)?;
            released_lock = Some(std::mem::replace(&mut seq.node, node));
            seq.lock_pages = seq.num_inserted_pages;
        }
        let auto_cache = seq.auto_cache;
        let bounded = seq.bounded();
        let cached_at = if relock {
            cow.iter().position(|&gi| gi == (0, seq.num_inserted_pages))
        } else {
            None
        };
        for (k, &(old, copy)) in copies.iter().enumerate() {
            let src = self.queue_copy(st, old, copy)?;
            st.stats.num_cow_copies += 1;
            if Some(k) == cached_at && src == old {
                // The copy reads the cached page itself: its node stays locked for the copy. (A
                // copy resolved to an earlier source reads that one instead, which is protected
                // on its own; the cached page is then an ordinary one, unlocked below.)
                if let Some(node) = released_lock.take() {
                    st.copy_locks.push((node, src));
                }
            }
        }
        if let Some(node) = released_lock {
            st.tree.unlock(node).map_err(internal)?;
        }
        if !copies.is_empty() {
            let olds: Vec<PageId> = copies.iter().map(|&(old, _)| old).collect();
            self.release_table(st, &olds)?;
        }
        if !stale.is_empty() {
            self.release_table(st, &stale)?;
        }
        if bounded {
            // Appending says every old token is computed.
            self.prepare_bounds(st, seq_id, old_len)?;
        }
        if auto_cache {
            self.cache_full_pages(st, seq_id, new_len / ps, now)?;
        }
        if bounded {
            self.drop_bounded(st, seq_id)?;
        }
        self.adopt_copies(st, seq_id, computed_copies)?;
        Ok(true)
    }

    /// The tree takes the sequence's copies of the pages in its first `count` recorded ranges
    /// (computed by now) where only this sequence holds the tree's own, which it frees; those
    /// ranges are then forgotten, swapped or not (another holder of the tree's pages uses them:
    /// nothing is held for nobody). One walk up the sequence's path per range, once.
    fn adopt_copies(&self, st: &mut State, seq_id: SeqId, count: usize) -> KvResult<()> {
        if count == 0 {
            return Ok(()); // the common case (every append): no lookup
        }
        let Some(seq) = st.seqs.get_mut(&seq_id) else {
            return Ok(());
        };
        let ranges: Vec<(usize, usize)> = seq.copies.drain(..count.min(seq.copies.len())).collect();
        let (node, ns, lock_pages, inserted) =
            (seq.node, seq.ns, seq.lock_pages, seq.num_inserted_pages);
        for (start, end) in ranges {
            let end = end.min(inserted);
            if start >= end {
                continue;
            }
            let seq = &st.seqs[&seq_id];
            let swapped = st
                .tree
                .adopt_copies(node, ns, lock_pages, start, &seq.pages[start..end])
                .map_err(internal)?;
            if swapped.len() < end - start {
                self.share_tree_copies(st, seq_id, (node, lock_pages), (start, end))?;
            }
            if swapped.is_empty() {
                continue;
            }
            if st.events.is_some() {
                let tokens = st.seqs[&seq_id].tokens[..lock_pages * self.page_size].to_vec();
                self.record_swapped(st, node, lock_pages, &swapped, &tokens)?;
            }
            let (old, new): (Vec<PageId>, Vec<PageId>) =
                swapped.iter().map(|&(_, o, n)| (o, n)).unzip();
            self.alloc.retain_serialized(&new).map_err(internal)?; // the tree's reference moves
            self.alloc.free_serialized(&old).map_err(internal)?;
        }
        Ok(())
    }

    /// Where the tree kept its own copy of pages `start..end` of `seq_id` (a public node, which
    /// never takes a tenant's page, or a copy another sequence holds too), the sequence shares the
    /// tree's copy, which its path locks anyway, and frees its own (identical K/V: same tokens
    /// after the same prefix, both computed); else it would hold two pages for one until freed.
    /// Only a copy nobody else holds (no fork, no queued copy) is freed.
    fn share_tree_copies(
        &self,
        st: &mut State,
        seq_id: SeqId,
        (node, lock_pages): (NodeId, usize),
        (start, end): (usize, usize),
    ) -> KvResult<()> {
        let mut path = Vec::with_capacity(lock_pages - start);
        st.tree.path_pages(node, lock_pages - start, &mut path);
        let mut freed = Vec::new();
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        for (pos, &(tree_page, _)) in (start..end).zip(&path) {
            let own = seq.pages[pos];
            let private = own != tree_page
                && own != crate::NULL_PAGE
                && !st.tree.contains_page(own)
                && self.alloc.ref_count(own).map_err(internal)? == 1
                && !st
                    .pending_copies
                    .iter()
                    .any(|&(src, dst)| src == own || dst == own);
            if private {
                self.alloc
                    .retain_serialized(&[tree_page])
                    .map_err(internal)?;
                seq.pages[pos] = tree_page;
                freed.push(own);
            }
        }
        self.alloc.free_serialized(&freed).map_err(internal)
    }

    /// Roll `seq_id` back to its first `num_tokens` tokens (rejected drafts), releasing the
    /// slots and pages past them; its cached pages beyond stay cached (their K/V is right for the
    /// tokens they hold). A page the sequence keeps that is shared or cached is never written
    /// through: the next write into it copies it first. `InvalidArgument` (nothing changed) for
    /// `num_tokens` of 0 (free the sequence instead) or beyond its tokens.
    pub fn truncate(&self, seq_id: SeqId, num_tokens: usize) -> KvResult<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let seq = ready_mut(&mut st.seqs, seq_id)?;
        if num_tokens == 0 || num_tokens > seq.tokens.len() {
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id} has {} tokens, cannot truncate to {num_tokens} (free it to drop \
                 it all)",
                seq.tokens.len()
            )));
        }
        let ps = self.page_size;
        if seq.bounded() {
            let seq = &st.seqs[&seq_id];
            self.check_truncate_bounds(st, seq_id, seq, num_tokens)?;
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.tokens.truncate(num_tokens);
        seq.slots = seq.slots.min(num_tokens);
        seq.num_committed = seq.num_committed.min(num_tokens);
        let keep = seq.slots.div_ceil(ps);
        let mut released = seq.pages.split_off(keep);
        for t in &mut seq.extra {
            released.extend(t.split_off(keep));
        }
        if let Some(b) = seq.bounds.as_deref_mut() {
            b.computed = b.computed.min(num_tokens);
            // Tokens from the cut on are computed again over the compacted context: private.
            if let Some(p) = b.private_from {
                b.private_from = Some(p.min(num_tokens));
            }
        }
        let full = num_tokens / ps;
        // Cached pages past the cut stay in the tree; the sequence locks only what it keeps: its
        // full pages, and the cached page it now ends inside, if its path holds that one (the
        // sequence's next write into it makes a private copy first).
        let ends_in_cached = num_tokens % ps != 0
            && full < seq.lock_pages
            && seq
                .pages
                .get(full)
                .is_some_and(|&p| st.tree.contains_page(p));
        let lock_pages = if ends_in_cached {
            full + 1
        } else {
            full.min(seq.lock_pages)
        };
        if lock_pages != seq.lock_pages {
            let node = st.tree.cut_path(seq.node, lock_pages).map_err(internal)?;
            st.tree.lock(node).map_err(internal)?;
            st.tree.unlock(seq.node).map_err(internal)?;
            seq.node = node;
            seq.lock_pages = lock_pages;
        }
        seq.num_inserted_pages = seq.num_inserted_pages.min(full);
        seq.keys.truncate(full);
        // Copies past the cut are gone: pages refilled there later are other, uncomputed ones.
        seq.copies.retain_mut(|r| {
            r.1 = r.1.min(full);
            r.0 < r.1
        });
        self.mrc_truncate(st, seq_id, full)?;
        self.release_table(st, &released)
    }

    /// Reserve slots for the next `num_tokens` tokens of `seq_id`'s known prompt (admitted with
    /// `reserve`). `false` (nothing changed) if the pages cannot be found even after evicting;
    /// `InvalidArgument` if fewer prompt tokens are left unreserved. With `cache_prompt`, the full
    /// pages reserved are cached at once (computed in this step).
    pub fn reserve(&self, seq_id: SeqId, num_tokens: usize, now: u64) -> KvResult<bool> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let seq = ready(&st.seqs, seq_id)?;
        let left = seq.tokens.len().saturating_sub(seq.slots);
        if num_tokens > left {
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id} has {left} prompt tokens left to reserve, cannot reserve \
                 {num_tokens} (generated tokens are reserved by append)"
            )));
        }
        let slots = seq.slots + num_tokens;
        let grow = slots.div_ceil(self.page_size) - seq.pages.len();
        let num_tables = 1 + seq.extra.len();
        let mut fresh = Vec::with_capacity(grow * num_tables);
        if !self.allocate(st, grow * num_tables, now, &mut fresh) {
            st.stats.num_refused += 1;
            return Ok(false);
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        // The partial last page is the sequence's own: a sequence with unreserved tokens is never
        // forked, and cached pages are full.
        let old_slots = seq.slots;
        for (g, more) in fresh.chunks(grow.max(1)).enumerate() {
            seq.table_mut(g).extend_from_slice(more);
        }
        seq.slots = slots;
        let (auto_cache, bounded) = (seq.auto_cache, seq.bounded());
        if bounded {
            // The chunks reserved before this one are computed (committed, when not cached as
            // reserved).
            let computed = if auto_cache {
                old_slots
            } else {
                seq.num_committed
            };
            self.prepare_bounds(st, seq_id, computed)?;
        }
        if auto_cache {
            let full = st.seqs[&seq_id].computable() / self.page_size;
            self.cache_full_pages(st, seq_id, full, now)?;
        }
        if bounded {
            self.drop_bounded(st, seq_id)?;
        }
        Ok(true)
    }

    /// The page keys of `seq_id`'s full computable pages (see [`crate::keys`]), in its namespace,
    /// chained from this cache's root key. O(tokens); SHA-256.
    pub fn page_keys(&self, seq_id: SeqId) -> KvResult<Vec<PageKey>> {
        let guard = self.state.lock();
        let seq = guard.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let missing = || {
            internal(KvError::Internal(format!(
                "sequence {seq_id}'s namespace has no name"
            )))
        };
        let ps = self.page_size;
        let full = seq.computable() / ps;
        // Its cached pages are keyed in the namespace of the tree node holding them (a public
        // prefix under "*"), as the events report them; the others in its own namespace.
        let mut path = Vec::new();
        guard.tree.path_pages(seq.node, seq.lock_pages, &mut path);
        let mut keys = Vec::with_capacity(full);
        let mut prev = self.root_key;
        for (i, page) in seq.tokens[..full * ps].chunks_exact(ps).enumerate() {
            let ns = path.get(i).map_or(seq.ns, |&(_, ns)| ns);
            prev = crate::keys::page_key(&prev, guard.key_namespace(ns).ok_or_else(missing)?, page);
            keys.push(prev);
        }
        Ok(keys)
    }

    /// The root page key of this cache (the parent of every first page).
    pub fn root_key(&self) -> PageKey {
        self.root_key
    }

    /// Tokens of `seq_id` with a slot reserved (`seq_len` once its prompt is fully reserved).
    pub fn num_reserved(&self, seq_id: SeqId) -> KvResult<usize> {
        Ok(self
            .state
            .lock()
            .seqs
            .get(&seq_id)
            .ok_or_else(|| unknown(seq_id))?
            .slots)
    }

    /// The engine has computed the first `num_tokens` tokens of `seq_id`: cache its full pages
    /// among them that are not cached yet (for sequences admitted with `cache_prompt == false`;
    /// harmless for the others). Returns the number of tokens of `seq_id` now cached.
    pub fn commit(&self, seq_id: SeqId, num_tokens: usize, now: u64) -> KvResult<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let seq = ready(&st.seqs, seq_id)?;
        if num_tokens > seq.computable() {
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id} has {} tokens with {} slots reserved, cannot commit {num_tokens}",
                seq.tokens.len(),
                seq.slots
            )));
        }
        let bounded = seq.bounded();
        if bounded {
            self.prepare_bounds(st, seq_id, num_tokens)?;
        }
        self.cache_full_pages(st, seq_id, num_tokens / self.page_size, now)?;
        if bounded {
            self.drop_bounded(st, seq_id)?;
        }
        // What commit cached is computed: the tree can take the sequence's copies now. (A sequence
        // that caches as it reserves recorded its copies before they were computed: its next
        // append adopts them.)
        let ready =
            st.seqs
                .get(&seq_id)
                .map_or(0, |seq| if seq.auto_cache { 0 } else { seq.copies.len() });
        self.adopt_copies(st, seq_id, ready)?;
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.num_committed = seq.num_committed.max(num_tokens);
        Ok(seq.num_inserted_pages * self.page_size)
    }

    /// Offer the sequence's full pages up to `full` (exclusive) that the tree has not seen yet,
    /// continuing its locked node: O(new pages). Retains what the tree adopts and moves the lock.
    fn cache_full_pages(
        &self,
        st: &mut State,
        seq_id: SeqId,
        full: usize,
        now: u64,
    ) -> KvResult<()> {
        let ps = self.page_size;
        let mut full = full;
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let done = seq.num_inserted_pages;
        if let Some(b) = seq.bounds.as_deref() {
            // Private pages are never cached; nor can a released page be.
            if let Some(p) = b.private_from {
                full = full.min(p / ps);
            }
            if full > done {
                if let Some(hole) = seq.pages[done..full]
                    .iter()
                    .position(|&p| p == crate::NULL_PAGE)
                {
                    full = done + hole;
                }
            }
            if st.groups.primary_windowed() {
                if full > done {
                    self.cache_group_pages(st, seq_id, done, full)?;
                    let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
                    seq.num_inserted_pages = full;
                }
                return self.mrc_fill(st, seq_id, full);
            }
        }
        self.mrc_fill(st, seq_id, full)?;
        let State {
            tree,
            seqs,
            pending_copies,
            copy_locks,
            ..
        } = st;
        let seq = seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if full <= done {
            return Ok(());
        }
        let (tokens, pages) = (&seq.tokens[done * ps..full * ps], &seq.pages[done..full]);
        // Extend from the node that ends where the sequence's cached pages end (its locked node,
        // or an ancestor of it after a truncate).
        let from = if seq.lock_pages == done {
            seq.node
        } else {
            tree.cut_path(seq.node, done).map_err(internal)?
        };
        let ins = tree
            .extend(seq.ns, from, tokens, pages, seq.priority, now)
            .map_err(internal)?;
        let adopted = &pages[ins.adopted()];
        self.alloc.retain_serialized(adopted).map_err(internal)?;
        tree.lock(ins.node).map_err(internal)?;
        // A page a queued copy still reads (its source) is not evictable until the copy is taken:
        // evicting it would free nothing. Lock its path until then (one step), so that what the
        // tree counts as evictable is exactly what eviction can return to the pool.
        for &(src, _) in pending_copies.iter() {
            if adopted.contains(&src) && !copy_locks.iter().any(|&(_, s)| s == src) {
                tree.lock(ins.node).map_err(internal)?;
                copy_locks.push((ins.node, src));
            }
        }
        tree.unlock(seq.node).map_err(internal)?;
        seq.node = ins.node;
        seq.num_inserted_pages = full;
        seq.lock_pages = full;
        if ins.num_existing_pages > 0 {
            seq.copies.push((done, done + ins.num_existing_pages));
        }
        let priority = seq.priority;
        let fresh = full - ins.num_adopted_pages;
        if st.events.is_some() && ins.num_adopted_pages > 0 {
            let seq = &st.seqs[&seq_id];
            let tokens = seq.tokens[(full - ins.num_adopted_pages) * ps..full * ps].to_vec();
            let ns = seq.ns;
            self.record_stored(st, ins.node, ins.num_adopted_pages, &tokens, ns)?;
        }
        if st.groups.num_groups() > 1 {
            self.cache_group_pages(st, seq_id, done, full)?;
        }
        let trigger = tiers::Trigger::Cached { priority, fresh };
        self.offer_seq_stores(st, seq_id, full, trigger, now)
    }

    /// `child` shares every page of `parent` (parallel sampling, beam search). The next append
    /// into a shared partially filled page copies it first.
    ///
    /// One rule: the parent's every token must be computed, since the child (and a copy made for
    /// it) reads every slot of the pages it shares. A parent admitted with `cache_prompt = false`
    /// must have committed all its tokens (`commit(parent, seq_len(parent))`), the partial last
    /// page's included; otherwise `InvalidArgument`, nothing changed.
    pub fn fork(&self, parent: SeqId, child: SeqId) -> KvResult<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(format!(
                "sequence {child} already exists"
            )));
        }
        let seq = ready(&st.seqs, parent)?;
        if !seq.fully_computed() {
            // A child would share (and its copies would read) slots never computed; and pages
            // cached later by one holder would be shared with a sibling that does not lock them.
            return Err(KvError::InvalidArgument(format!(
                "sequence {parent} has {} tokens but only {} committed: commit all its tokens \
                 (commit(seq_id, seq_len)) before forking it",
                seq.tokens.len(),
                seq.num_committed
            )));
        }
        let mut seq = seq.clone();
        seq.copies.clear(); // the parent's to adopt (the child shares its pages and its lock)
        if seq.bounded() || !seq.extra.is_empty() {
            self.retain_table(st, &seq.pages)?;
            for t in &seq.extra {
                self.retain_table(st, t)?;
            }
        } else {
            self.alloc.retain_serialized(&seq.pages).map_err(internal)?;
        }
        st.tree.lock(seq.node).map_err(internal)?;
        st.add_live(seq.ns);
        st.seqs.insert(child, seq);
        Ok(())
    }

    /// Release a finished sequence: its full pages stay cached (evictable), the rest is freed.
    pub fn free_sequence(&self, seq_id: SeqId) -> KvResult<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let seq = st.seqs.remove(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if seq.loading.is_some() {
            self.cancel_loads(st, seq_id)?;
        }
        st.tree.unlock(seq.node).map_err(internal)?;
        self.release_sequence_pages(st, &seq)?;
        st.remove_live(seq.ns);
        Self::mrc_release(st, &seq.mrc);
        Ok(())
    }

    /// Evict up to `num_pages` cached pages (policy order); returns how many were evicted.
    pub fn evict(&self, num_pages: usize, now: u64) -> KvResult<usize> {
        let mut guard = self.state.lock();
        self.evict_locked(&mut guard, num_pages, now)
    }

    /// Keep the cached prefix of `tokens` in `namespace` resident until `now + ttl`. Returns the
    /// pages pinned. Err (nothing changed) if the pin budget would be exceeded.
    pub fn pin(
        &self,
        tokens: &[u32],
        ttl: u64,
        namespace: Option<&str>,
        now: u64,
    ) -> KvResult<usize> {
        let mut guard = self.state.lock();
        // A name never interned owns no node: it can pin only public prefixes, and interns nothing.
        let ns = guard.known_namespace(namespace).unwrap_or(UNSEEN_NAMESPACE);
        let st = &mut *guard;
        // The group caches' pages a hit of the prefix needs are pinned with the tree's, under the
        // same budget (checked for both before either changes).
        let plan = if st.groups.active() && ttl > 0 {
            st.tree.expire_pins(now);
            st.groups.expire_pins(now);
            let (hit, point, pages) = self.group_pin_plan(st, ns, tokens);
            let more = st.tree.pin_new_pages(ns, tokens)
                + point.map_or(0, |k| st.groups.new_pin_pages(&k, &pages));
            let covered = st.tree.num_pin_covered_pages() + st.groups.num_pin_covered();
            let budget = st.tree.pin_budget_pages();
            if more > budget.saturating_sub(covered) {
                return Err(KvError::InvalidArgument(format!(
                    "pin: {more} more pinned pages (every group's) exceed the pin budget ({} of \
                     {budget} pages left)",
                    budget.saturating_sub(covered)
                )));
            }
            Some((hit, point, pages))
        } else {
            None
        };
        let mut pinned = st.tree.pin(ns, tokens, ttl, now)?;
        if let Some((hit, point, pages)) = plan {
            if let Some(key) = point {
                st.groups.add_pin(key, now.saturating_add(ttl), pages);
            }
            if st.groups.primary_windowed() {
                pinned = hit;
            }
        }
        if pinned > 0 && ns != UNSEEN_NAMESPACE && st.store_policy.may_store(tiers::Trigger::Pinned)
        {
            let ps = self.page_size;
            let mut pages = Vec::with_capacity(pinned);
            // Pinning is a use: the match touches the pinned path as a hit would.
            let hit = st
                .tree
                .match_prefix(ns, &tokens[..pinned * ps], 0, now, &mut pages);
            let mut keys = Vec::with_capacity(pinned);
            let public = st.tree.public_pages(hit.node);
            self.extend_keys(st, ns, tokens, hit.num_pages, &mut keys, public)?;
            self.offer_stores(
                st,
                (ns, hit.node),
                tokens,
                (&keys, public),
                hit.num_pages,
                tiers::Trigger::Pinned,
                now,
            )?;
        }
        Ok(pinned)
    }

    /// Keep at least `num_pages` cached pages of `namespace` (`None`: the default one) in HBM, or
    /// slots in lower tier `tier`, while other pages can go: eviction takes a tenant's pages at or
    /// below its floor only when nothing else is evictable (0 removes the floor). The floor
    /// outlives the namespace's name: it applies again whenever the name comes back.
    /// `InvalidArgument` (nothing changed) for the public namespace or an unknown tier.
    pub fn set_tenant_floor(
        &self,
        namespace: Option<&str>,
        num_pages: usize,
        tier: Option<&str>,
    ) -> KvResult<()> {
        self.set_tenant_quota(namespace, tier, "set_tenant_floor", |q| q.0 = num_pages)
    }

    /// Past `num_pages` cached pages (or slots of lower tier `tier`), `namespace`'s pages are
    /// evicted before any other tenant's (`None` removes the ceiling): its share, which it may
    /// exceed only while nothing else needs the room. Otherwise as [`set_tenant_floor`](Self::set_tenant_floor).
    pub fn set_tenant_ceiling(
        &self,
        namespace: Option<&str>,
        num_pages: Option<usize>,
        tier: Option<&str>,
    ) -> KvResult<()> {
        self.set_tenant_quota(namespace, tier, "set_tenant_ceiling", |q| q.1 = num_pages)
    }

    fn set_tenant_quota(
        &self,
        namespace: Option<&str>,
        tier: Option<&str>,
        op: &str,
        f: impl FnOnce(&mut TenantQuota),
    ) -> KvResult<()> {
        if namespace == Some(PUBLIC_NAMESPACE_NAME) {
            return Err(KvError::InvalidArgument(format!(
                "{op}: the public namespace has no quota (it is every tenant's)"
            )));
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // "hbm" (what `tenant_floors` reports) is HBM too: no lower tier may take that name.
        let t = match tier {
            None => None,
            Some(name) if name.eq_ignore_ascii_case("hbm") => None,
            Some(name) => Some(Self::tier_index(st, name, op)?),
        };
        let key = (namespace.map(str::to_owned), t);
        let mut quota = st.tenant_floors.get(&key).copied().unwrap_or((0, None));
        f(&mut quota);
        if let Some(ns) = st.known_namespace(namespace) {
            let tree = st.floor_tree(t);
            tree.set_floor(ns, quota.0)?;
            tree.set_ceiling(ns, quota.1)?;
        }
        if quota == (0, None) {
            st.tenant_floors.remove(&key);
        } else {
            st.tenant_floors.insert(key, quota);
        }
        Ok(())
    }

    /// `(namespace, tier, floor, cached pages)` of every tenant floor (`tier`: `"hbm"` or a lower
    /// tier's name; cached pages: 0 for a name not interned now), sorted.
    pub fn tenant_floors(&self) -> Vec<(Option<String>, String, usize, usize)> {
        self.tenant_quotas()
            .into_iter()
            .filter(|q| q.2 > 0)
            .map(|(name, tier, floor, _, cached)| (name, tier, floor, cached))
            .collect()
    }

    /// `(namespace, tier, floor, ceiling, cached pages)` of every tenant quota, sorted.
    #[allow(clippy::type_complexity)]
    pub fn tenant_quotas(&self) -> Vec<(Option<String>, String, usize, Option<usize>, usize)> {
        let mut st = self.state.lock();
        let quotas: Vec<_> = st
            .tenant_floors
            .iter()
            .map(|(k, &q)| (k.clone(), q))
            .collect();
        let mut out: Vec<_> = quotas
            .into_iter()
            .map(|((name, t), (floor, ceiling))| {
                let cached = st
                    .known_namespace(name.as_deref())
                    .and_then(|ns| st.floor_tree(t).quota(ns))
                    .map_or(0, |q| q.cached);
                let tier = t.map_or_else(|| "hbm".to_owned(), |i| st.tiers[i].config.name.clone());
                (name, tier, floor, ceiling, cached)
            })
            .collect();
        out.sort();
        out
    }

    /// The store policy in force (which pages go down to the lower tiers).
    pub fn store_policy(&self) -> StorePolicy {
        self.state.lock().store_policy.clone()
    }

    /// Replace the store policy (a pressure controller making stores more selective, and back).
    /// Stores already queued are not affected. `InvalidArgument` (nothing changed) for a policy
    /// the constructor would refuse.
    pub fn set_store_policy(&self, policy: StorePolicy) -> KvResult<()> {
        check_store_policy(&policy)?;
        self.state.lock().store_policy = policy;
        Ok(())
    }

    /// Shorten every pin that would outlive `now + max_ttl` to expire then; returns the pins
    /// shortened (a pressure controller's "shorter TTLs").
    pub fn cap_pins(&self, max_ttl: u64, now: u64) -> usize {
        let mut guard = self.state.lock();
        let capped = guard.tree.cap_pins(max_ttl, now);
        guard.groups.expire_pins(now);
        let group_capped = guard.groups.cap_pins(now.saturating_add(max_ttl));
        // A grouped manager's pin is one pin, in the tree and the group caches at once: counted
        // once, where the prefix's own pages are.
        if guard.groups.primary_windowed() {
            group_capped
        } else {
            capped
        }
    }

    /// Remove the deepest pin on the prefix of `tokens` in `namespace`; returns the pages no pin
    /// covers any more (the tree's and, on a grouped manager, the group caches').
    pub fn unpin(&self, tokens: &[u32], namespace: Option<&str>) -> usize {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        match st.known_namespace(namespace) {
            Some(ns) => {
                let mut unpinned = st.tree.unpin(ns, tokens);
                if st.groups.active() {
                    // The deepest group pin of the same path (the tree's twin: made by the same
                    // `pin`), its pages only: another pin's stay pinned. It ends at one of the
                    // candidate pages' keys.
                    let keys = self.peek_group_hit(st, ns, tokens).1;
                    unpinned += st.groups.unpin_deepest(&keys);
                }
                unpinned
            }
            None => 0,
        }
    }

    /// Cached prompt tokens a lookup of `tokens` would find now (no side effects).
    pub fn peek_prefix_len(&self, tokens: &[u32], namespace: Option<&str>) -> usize {
        let guard = self.state.lock();
        // A namespace never seen has no pages of its own, but sees the public ones.
        let ns = guard.known_namespace(namespace).unwrap_or(UNSEEN_NAMESPACE);
        if guard.groups.active() {
            return self.peek_group_hit(&guard, ns, tokens).0 * self.page_size;
        }
        guard.tree.peek_prefix_len(ns, tokens) * self.page_size
    }

    /// Interned namespace names (those with a live sequence or a cached page).
    pub fn num_namespaces(&self) -> usize {
        self.state.lock().namespaces.len()
    }

    /// The usage split and counters (expired pins are released first).
    pub fn stats(&self, now: u64) -> CacheStats {
        let mut guard = self.state.lock();
        guard.tree.expire_pins(now);
        guard.groups.expire_pins(now);
        let total = self.alloc.num_pages() - 1;
        let free = self.alloc.num_free();
        let cached = guard.tree.num_evictable_pages() + guard.groups.num_evictable();
        let pinned = guard.tree.num_pinned_pages() + guard.groups.num_pinned_idle();
        CacheStats {
            num_pages_total: total,
            num_pages_in_use: total.saturating_sub(free + cached + pinned),
            num_pages_cached: cached,
            num_pages_pinned: pinned,
            num_pages_free: free,
            num_sequences: guard.seqs.len(),
            ..guard.stats.clone()
        }
    }

    /// Whether `seq_id` is live.
    pub fn contains(&self, seq_id: SeqId) -> bool {
        self.state.lock().seqs.contains_key(&seq_id)
    }

    /// Tokens of `seq_id`.
    pub fn seq_len(&self, seq_id: SeqId) -> KvResult<usize> {
        Ok(self
            .state
            .lock()
            .seqs
            .get(&seq_id)
            .ok_or_else(|| unknown(seq_id))?
            .tokens
            .len())
    }

    /// The page table of one sequence (a copy; for tests and debugging).
    pub fn seq_pages(&self, seq_id: SeqId) -> KvResult<Vec<PageId>> {
        self.seq_group_pages(seq_id, 0)
    }

    /// The page table of one sequence in caller group `group` (released pages are the null page).
    pub fn seq_group_pages(&self, seq_id: SeqId, group: usize) -> KvResult<Vec<PageId>> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let seq = guard.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        Ok(seq.table(g).to_vec())
    }

    /// Windows of the KV-cache groups, in the caller's order (`None`: full attention).
    pub fn group_windows(&self) -> Vec<Option<usize>> {
        let guard = self.state.lock();
        let g = &guard.groups;
        g.to_internal.iter().map(|&i| g.windows[i]).collect()
    }

    /// Every page the tree and the group caches hold (for invariant checks).
    pub fn cached_pages(&self) -> Vec<PageId> {
        let guard = self.state.lock();
        guard.tree.pages().chain(guard.groups.pages()).collect()
    }

    /// Live sequence ids, in no particular order.
    pub fn seq_ids(&self) -> Vec<SeqId> {
        self.state.lock().seqs.keys().copied().collect()
    }

    /// Append `n` fresh pages to `out`, evicting cached pages if the pool is short. `false` (and
    /// `out` as it was, nothing evicted) if even evicting everything evictable is not enough.
    fn allocate(&self, st: &mut State, n: usize, now: u64, out: &mut Vec<PageId>) -> bool {
        let start = out.len();
        out.resize(start + n, crate::NULL_PAGE);
        // The manager owns its allocator and holds the state lock: the free count is stable here.
        if self.alloc.allocate_into(&mut out[start..]).unwrap_or(false) {
            return true;
        }
        st.tree.expire_pins(now);
        st.groups.expire_pins(now);
        let short = n.saturating_sub(self.alloc.num_free());
        let evictable = st.tree.num_evictable_pages() + st.groups.num_evictable();
        if short > evictable || self.evict_locked(st, short, now).is_err() {
            out.truncate(start);
            return false;
        }
        if self.alloc.allocate_into(&mut out[start..]).unwrap_or(false) {
            return true;
        }
        out.truncate(start);
        false
    }

    /// Offer the first `n` full pages of `seq_id` (cached in the HBM tree) to the lower tiers.
    fn offer_seq_stores(
        &self,
        st: &mut State,
        seq_id: SeqId,
        n: usize,
        trigger: tiers::Trigger,
        now: u64,
    ) -> KvResult<()> {
        if st.tiers.is_empty() || !st.store_policy.may_store(trigger) {
            return Ok(());
        }
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        // The common case, a prefix every tier holds already: no key, no store.
        if !self.tiers_lack(st, seq.ns, &seq.tokens, n) {
            return Ok(());
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let (ns, node) = (seq.ns, seq.node);
        let tokens = std::mem::take(&mut seq.tokens);
        let mut keys = std::mem::take(&mut seq.keys);
        let node_pages = seq.lock_pages;
        let public = st.tree.public_pages(node);
        let result = self
            .extend_keys(st, ns, &tokens, n, &mut keys, public)
            .and_then(|()| {
                // The sequence's node ends at `lock_pages`; the stores need the node ending at `n`.
                let node = if node_pages == n {
                    node
                } else {
                    st.tree.cut_path(node, n).map_err(internal)?
                };
                self.offer_stores(st, (ns, node), &tokens, (&keys, public), n, trigger, now)
            });
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.tokens = tokens;
        seq.keys = keys;
        result
    }

    fn evict_locked(&self, st: &mut State, num_pages: usize, now: u64) -> KvResult<usize> {
        st.groups.expire_pins(now);
        if !st.groups.active() {
            return self.evict_tree(st, num_pages, now); // (the tree frees leaves up in one pass)
        }
        // A page one side frees can leave the other's last reference evictable (a group page a
        // forked or adopted table shared): passes until enough, or nothing more goes.
        let mut done = 0;
        while done < num_pages {
            let n = self.evict_pass(st, num_pages - done, now)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    fn evict_pass(&self, st: &mut State, num_pages: usize, now: u64) -> KvResult<usize> {
        // The group caches give their share, in proportion to what each side holds evictable,
        // and whatever the tree cannot give.
        let from_groups = st.groups.num_evictable();
        if from_groups == 0 {
            return self.evict_tree(st, num_pages, now);
        }
        let tree_ev = st.tree.num_evictable_pages();
        let share = ((num_pages as u128 * from_groups as u128)
            .div_ceil((from_groups + tree_ev) as u128)) as usize;
        let share = share.min(from_groups).min(num_pages);
        // The share spares the group caches' floor pages (the tree gives what they keep back);
        // they yield only when the tree has nothing more either.
        let mut from_maps = self.evict_group_pages(st, share, false)?;
        let from_tree = self.evict_tree(st, num_pages - from_maps, now)?;
        if from_maps + from_tree < num_pages {
            from_maps += self.evict_group_pages(st, num_pages - from_maps - from_tree, true)?;
        }
        st.stats.num_evicted_pages += from_maps as u64;
        Ok(from_maps + from_tree)
    }

    fn evict_tree(&self, st: &mut State, num_pages: usize, now: u64) -> KvResult<usize> {
        let mut evicted = std::mem::take(&mut st.evicted);
        evicted.clear();
        let n = st.tree.evict(num_pages, now, &mut evicted);
        let released = self.release(st, &evicted);
        self.record_removed(st, &evicted);
        st.evicted = evicted;
        released?;
        st.stats.num_evicted_pages += n as u64;
        let mut emptied = std::mem::take(&mut st.emptied);
        st.tree.take_emptied_namespaces(&mut emptied);
        for ns in emptied.drain(..) {
            st.forget_if_unused(ns);
        }
        st.emptied = emptied;
        Ok(n)
    }
}

fn unknown(seq_id: SeqId) -> KvError {
    KvError::UnknownSequence(format!("no sequence {seq_id}"))
}

fn loading(seq_id: SeqId) -> KvError {
    KvError::InvalidArgument(format!(
        "sequence {seq_id} is loading its prefix from a lower tier: complete its transfers \
         (is_ready) first"
    ))
}

/// A live sequence whose prefix is in HBM (its table valid): `UnknownSequence` or
/// `InvalidArgument` (loading) otherwise.
/// A store policy's parameters are usable: `InvalidArgument` otherwise.
fn check_store_policy(policy: &StorePolicy) -> KvResult<()> {
    if let StorePolicy::Value(m) = policy {
        let fields = [
            m.page_bytes,
            m.prefill_us_per_token,
            m.attention_us_per_token_per_1k,
            m.prior_hits,
            m.prior_misses,
            m.depth_scale_tokens,
        ];
        if fields.iter().any(|x| !x.is_finite() || *x < 0.0)
            || m.prior_misses <= 0.0
            || m.depth_scale_tokens <= 0.0
        {
            return Err(KvError::InvalidArgument(format!(
                "store policy 'value': every parameter must be finite and >= 0 (prior_misses and \
                 depth_scale_tokens > 0), got {m:?}"
            )));
        }
    }
    Ok(())
}

/// What `append` requires of a sequence: live, ready, and its whole known prompt reserved.
fn check_appendable(seqs: &SeqMap, seq_id: SeqId) -> KvResult<()> {
    let seq = ready(seqs, seq_id)?;
    if seq.slots < seq.tokens.len() {
        return Err(KvError::InvalidArgument(format!(
            "sequence {seq_id} has {} of its {} prompt tokens reserved: reserve the rest before \
             appending",
            seq.slots,
            seq.tokens.len()
        )));
    }
    Ok(())
}

fn ready(seqs: &SeqMap, seq_id: SeqId) -> KvResult<&Sequence> {
    match seqs.get(&seq_id) {
        None => Err(unknown(seq_id)),
        Some(seq) if seq.loading.is_some() => Err(loading(seq_id)),
        Some(seq) => Ok(seq),
    }
}

fn ready_mut(seqs: &mut SeqMap, seq_id: SeqId) -> KvResult<&mut Sequence> {
    match seqs.get_mut(&seq_id) {
        None => Err(unknown(seq_id)),
        Some(seq) if seq.loading.is_some() => Err(loading(seq_id)),
        Some(seq) => Ok(seq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(num_pages: usize, page_size: usize) -> KVCacheManager {
        KVCacheManager::new(ManagerConfig {
            num_pages,
            page_size,
            policy: EvictionPolicy::Lru,
            pin_budget_pages: None,
            fingerprint: Vec::new(),
            events: false,
            lower_tiers: Vec::new(),
            store_policy: Default::default(),
            groups: Vec::new(),
        })
        .unwrap()
    }

    fn check_split(m: &KVCacheManager) {
        let s = m.stats(0);
        assert_eq!(
            s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free,
            s.num_pages_total
        );
    }

    #[test]
    fn shared_prefix_is_reused() {
        let m = manager(64, 4);
        let prompt: Vec<u32> = (0..10).collect();
        assert_eq!(
            m.add_sequence(1, prompt.as_slice(), None, 0, true, 0)
                .unwrap(),
            Some(0)
        );
        let mut other = prompt[..8].to_vec();
        other.extend([100, 101, 102]);
        assert_eq!(
            m.add_sequence(2, other.as_slice(), None, 0, true, 0)
                .unwrap(),
            Some(8)
        );
        let (a, b) = (m.seq_pages(1).unwrap(), m.seq_pages(2).unwrap());
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        assert_eq!(m.ref_count(a[0]).unwrap(), 3); // tree + two sequences
        check_split(&m);
        // Another namespace sees nothing.
        assert_eq!(
            m.add_sequence(3, prompt.as_slice(), Some("tenant-b"), 0, true, 0)
                .unwrap(),
            Some(0)
        );
        check_split(&m);
    }

    #[test]
    fn batch_layout_is_page_table_and_slot_mapping_in_one_call() {
        let m = manager(64, 4);
        m.add_sequence(
            1,
            (0..10).collect::<Vec<u32>>().as_slice(),
            None,
            0,
            false,
            0,
        )
        .unwrap();
        m.add_sequence(2, [7, 8, 9], None, 0, false, 0).unwrap();
        let l = m.batch_layout(&[2, 1], &[2, 3], &[1, 6], 0).unwrap();
        assert_eq!(
            l.table,
            m.page_table(&[2, 1], Some(&[3, 9]), 0, false).unwrap()
        );
        assert_eq!(l.q_indptr, vec![0, 1, 7]);
        assert_eq!(l.positions, vec![2, 3, 4, 5, 6, 7, 8]);
        let mut slots = m.slot_mapping(2, 1, Some(2), 0).unwrap();
        slots.extend(m.slot_mapping(1, 6, Some(3), 0).unwrap());
        assert_eq!(l.slot_mapping, slots);
        // Rows past the reserved tokens, empty rows and ragged arguments fail.
        assert!(m.batch_layout(&[2], &[2], &[2], 0).is_err());
        assert!(m.batch_layout(&[2], &[0], &[0], 0).is_err());
        assert!(m.batch_layout(&[2, 1], &[0], &[1, 1], 0).is_err());
        assert!(m.batch_layout(&[2], &[usize::MAX], &[2], 0).is_err());
        assert!(m.batch_layout(&[3], &[0], &[1], 0).is_err());
    }

    #[test]
    fn fork_then_append_copies_the_shared_partial_page() {
        let m = manager(64, 4);
        m.add_sequence(1, [1, 2, 3, 4, 5, 6], None, 0, true, 0)
            .unwrap();
        m.fork(1, 2).unwrap();
        let before = m.seq_pages(1).unwrap();
        assert!(m.append(2, &[7], 0).unwrap());
        let after = m.seq_pages(2).unwrap();
        assert_eq!(before[0], after[0]);
        assert_ne!(before[1], after[1]);
        assert_eq!(
            m.take_pending_copies().unwrap(),
            vec![(before[1], after[1])]
        );
        assert!(m.append(1, &[8], 0).unwrap()); // now sole owner: no copy
        assert!(m.take_pending_copies().unwrap().is_empty());
        check_split(&m);
    }

    #[test]
    fn chained_copies_resolve_to_the_source_and_freed_ones_are_cancelled() {
        let m = manager(64, 4);
        m.add_sequence(1, [1, 2, 3, 4, 5, 6], Some("a"), 0, true, 0)
            .unwrap();
        let src = m.seq_pages(1).unwrap()[1];
        m.fork(1, 2).unwrap();
        assert!(m.append(2, &[7], 0).unwrap());
        m.fork(2, 3).unwrap();
        assert!(m.append(3, &[8], 0).unwrap());
        m.fork(1, 4).unwrap();
        assert!(m.append(4, &[9], 0).unwrap());
        m.free_sequence(4).unwrap(); // its copy is cancelled, its page free again
        let (d2, d3) = (m.seq_pages(2).unwrap()[1], m.seq_pages(3).unwrap()[1]);
        assert_eq!(m.ref_count(src).unwrap(), 1 + 2); // sequence 1 and two queued copies
        assert_eq!(m.take_pending_copies().unwrap(), vec![(src, d2), (src, d3)]);
        assert_eq!(m.ref_count(src).unwrap(), 1);
        check_split(&m);
        for id in [1, 2, 3] {
            m.free_sequence(id).unwrap();
        }
        m.evict(64, 0).unwrap();
        assert_eq!(m.num_namespaces(), 0);
        assert_eq!(m.stats(0).num_pages_free, 63);
    }

    #[test]
    fn refusal_changes_nothing() {
        let m = manager(5, 4); // 4 usable pages
        assert_eq!(
            m.add_sequence(1, [0; 12], None, 0, true, 0).unwrap(),
            Some(0)
        );
        let before = m.stats(0);
        assert_eq!(m.add_sequence(2, [9; 8], None, 0, true, 0).unwrap(), None);
        assert!(!m.contains(2));
        let after = m.stats(0);
        assert_eq!(
            (before.num_pages_free, before.num_pages_cached),
            (after.num_pages_free, after.num_pages_cached)
        );
        m.free_sequence(1).unwrap();
        assert_eq!(m.stats(0).num_pages_cached, 3);
        assert_eq!(
            m.add_sequence(2, [9; 16], None, 0, true, 0).unwrap(),
            Some(0)
        ); // evicts
        assert_eq!(m.stats(0).num_evicted_pages, 3);
        check_split(&m);
    }
}
