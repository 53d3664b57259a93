//! Lower tiers (host DRAM, NVMe, ...): where copies of cached pages live below HBM, and the
//! two-phase transfers that move them (F6, F7).
//!
//! # Residence
//! Each lower tier is a pool of `num_slots` slots, one page (every layer, K and V) per slot, with
//! its own radix tree over the same tokens and namespaces as the HBM tree (the same index code:
//! leaf-first eviction in policy order, locks, namespaces, public prefixes), holding slot ids.
//! A tier's tree is prefix-closed like the HBM one: a page is stored only below its parent's copy
//! in that tier, so every slot it holds extends a usable prefix. Each slot also keeps its page
//! key (the identity the bytes are stored under, namespace and fingerprint included) and a *bad*
//! flag (a load of it failed: matches stop before it until it is evicted).
//! Tiers are **inclusive**: storing a page below does not remove it from HBM, and each tier
//! decides on its own (a page may live in HBM, host and disk at once).
//!
//! # Transfers are two-phase
//! The manager queues transfers; [`take_transfers`](super::KVCacheManager::take_transfers) hands
//! them to the mover (Python moves the bytes), and
//! [`complete_transfers`](super::KVCacheManager::complete_transfers) reports each op's outcome.
//! - A **store** (a run of HBM pages -> fresh slots of one tier) locks the HBM path (the pages are
//!   neither evicted nor reused meanwhile) and the tier path above it (the parent copies stay);
//!   its slots join the tier's tree only when it completes OK: a store in flight or failed is
//!   never visible to a lookup. A store that finds no room (after evicting the tier's evictable
//!   slots) is skipped and counted; it never waits.
//! - A **load** (one slot -> one HBM page of a sequence being admitted) holds a reference on the
//!   HBM page and locks the slot's tier path, so neither is reused while the bytes move. The
//!   sequence is not ready ([`is_ready`](super::KVCacheManager::is_ready)) until its loads
//!   complete; its hit is then cut before the first failed page, and the engine recomputes the
//!   rest into the pages it already holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{internal, unknown, KVCacheManager, SeqId, State};
use crate::error::{try_boxed_slice, KvError, KvResult};
use crate::eviction::EvictionPolicy;
use crate::keys::{page_key, PageKey};
use crate::radix::{FxBuildHasher, Namespace, NodeId, RadixTree, PUBLIC_NAMESPACE, ROOT};
use crate::PageId;

/// One lower tier of a manager.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// Its name ("host", "disk", ...): unique within a manager.
    pub name: String,
    /// Slots (pages) it holds, >= 1.
    pub num_slots: usize,
    /// Bandwidth of a load or store, GB/s (the `value` policy's reload and store cost).
    pub bandwidth_gbps: f64,
}

/// Which pages are stored to the lower tiers.
#[derive(Clone, Debug, PartialEq)]
pub enum StorePolicy {
    /// Write-through: every page as it is cached (vLLM, KVBM, LMCache's behaviour).
    All,
    /// Pages used at least `min_hits` times (cached, then hit: 2), pinned pages, and pages cached
    /// with priority at least `min_priority`. The default (SGLang's `write_through_selective`,
    /// generalised).
    Selective {
        /// Uses (the insert and each prefix hit) that make a page worth storing.
        min_hits: u64,
        /// Priority at which a page is stored as soon as it is cached.
        min_priority: i32,
    },
    /// Store a page when its expected value is positive (see [`ValueModel`]).
    Value(ValueModel),
}

impl StorePolicy {
    /// Whether a store triggered by `trigger` can pass the policy (a cheap filter before any
    /// lookup in the tiers).
    pub(super) fn may_store(&self, trigger: Trigger) -> bool {
        match (self, trigger) {
            (StorePolicy::Selective { min_priority, .. }, Trigger::Cached { priority, .. }) => {
                priority >= *min_priority
            }
            _ => true,
        }
    }
}

impl Default for StorePolicy {
    fn default() -> Self {
        StorePolicy::Selective {
            min_hits: 2,
            min_priority: i32::MAX,
        }
    }
}

/// The `value` store policy: store page `d` (0-based depth in pages) into a tier when
///
/// ```text
/// reuses(hits, d) * (prefill(d) - reload(tier)) > store(tier)
/// reuses(hits, d) = (hits + prior_hits) / (prior_misses * (1 + d * page_size / depth_scale_tokens))
/// prefill(d)      = page_size * (prefill_us_per_token + attention_us_per_token_per_1k * (d + 0.5) * page_size / 1000)
/// reload = store  = page_bytes / (bandwidth_gbps * 1e3)        (microseconds)
/// ```
///
/// `reuses` is the expected number of future reuses (a Gamma-Poisson rate: hits raise it, depth
/// lowers it, as deeper pages of a prefix are shared by fewer requests); P(reuse) = 1 - e^-reuses.
/// A store is paid once (bandwidth now, NVMe wear) and each reuse saves a prefill minus a reload.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueModel {
    /// Bytes of one page over every layer (K and V).
    pub page_bytes: f64,
    /// Prefill cost per token, linear part (weights), microseconds.
    pub prefill_us_per_token: f64,
    /// Prefill cost per token per 1,000 tokens of context before it (attention), microseconds.
    pub attention_us_per_token_per_1k: f64,
    /// Pseudo-hits of the prior (a page never hit again).
    pub prior_hits: f64,
    /// Pseudo-misses of the prior.
    pub prior_misses: f64,
    /// Depth (tokens) at which the expected reuses halve.
    pub depth_scale_tokens: f64,
}

impl Default for ValueModel {
    /// Llama-3.1-8B in bf16 on an H200-class GPU: 128 KiB per token, prefill about 25 µs per
    /// token plus 0.84 µs per token per 1k tokens of context.
    fn default() -> Self {
        Self {
            page_bytes: 2.0 * 1024.0 * 1024.0,
            prefill_us_per_token: 25.0,
            attention_us_per_token_per_1k: 0.84,
            prior_hits: 0.5,
            prior_misses: 1.5,
            depth_scale_tokens: 4096.0,
        }
    }
}

impl ValueModel {
    /// Whether a page at `depth` pages, used `hits` times, is worth storing into a tier of
    /// `bandwidth_gbps` (see the type docs).
    pub fn worth_storing(
        &self,
        hits: u64,
        depth: usize,
        page_size: usize,
        bandwidth_gbps: f64,
    ) -> bool {
        let ps = page_size as f64;
        let reuses = (hits as f64 + self.prior_hits)
            / (self.prior_misses * (1.0 + depth as f64 * ps / self.depth_scale_tokens));
        let prefill = ps
            * (self.prefill_us_per_token
                + self.attention_us_per_token_per_1k * (depth as f64 + 0.5) * ps / 1000.0);
        let transfer = self.page_bytes / (bandwidth_gbps * 1e3);
        reuses * (prefill - transfer) > transfer
    }
}

/// Counters and occupancy of one lower tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The tier's name.
    pub name: String,
    /// Slots in the tier.
    pub num_slots: usize,
    /// Slots holding a stored page (visible to lookups unless bad).
    pub num_slots_cached: usize,
    /// Slots of those whose load failed (invisible; evicted in time).
    pub num_slots_bad: usize,
    /// Slots reserved by stores in flight.
    pub num_slots_in_flight: usize,
    /// Free slots.
    pub num_slots_free: usize,
    /// Slots locked by loads in flight or by stores below them (not evictable now).
    pub num_slots_locked: usize,
    /// Pages stored (stores completed OK).
    pub num_stored_pages: u64,
    /// Pages whose store failed (reported not OK).
    pub num_store_failed_pages: u64,
    /// Pages not stored for lack of room (nothing evictable left in the tier).
    pub num_store_skipped_no_room: u64,
    /// Pages not stored because the same page was in flight to the tier already.
    pub num_store_skipped_in_flight: u64,
    /// Pages loaded into HBM (loads completed OK).
    pub num_loaded_pages: u64,
    /// Pages whose load failed (I/O error, checksum or key mismatch).
    pub num_load_failed_pages: u64,
    /// Prompt tokens admitted from this tier (the loaded part of prefix hits).
    pub hit_tokens: u64,
    /// Slots evicted to make room.
    pub num_evicted_slots: u64,
    /// Pages restored from a previous run (`restore_tier`).
    pub num_restored_pages: u64,
    /// Pages indexed because the tier said it holds them (`mark_tier_pages`: a shared tier
    /// another instance filled).
    pub num_marked_pages: u64,
    /// Bad slots dropped after their load failed, with the pages after them in their leaf (a
    /// later store or lookup may put them back).
    pub num_dropped_bad_slots: u64,
}

/// One lower tier: its slot pool and index.
#[derive(Debug)]
pub(super) struct Tier {
    pub(super) config: TierConfig,
    /// Tokens -> slot + 1 (page ids in the tree are never 0, the null page).
    pub(super) tree: RadixTree,
    /// Free slots (a stack).
    free: Vec<u32>,
    /// Page key of the page each slot holds or receives.
    keys: Vec<PageKey>,
    /// Slots whose load failed.
    bad: Vec<bool>,
    num_bad: usize,
    /// Keys of pages in flight to this tier.
    storing: HashSet<PageKey>,
    stats: TierStats,
}

impl Tier {
    /// `Stored` events of every slot this tier holds, parents before their children: its part of an
    /// event snapshot (see `KVCacheManager::take_events`). Bad slots are included, as the live
    /// stream keeps them (a failed load sends no `Removed`: the slot holds its place).
    pub(super) fn snapshot_events(
        &self,
        label: impl Fn(Namespace) -> Option<String>,
        out: &mut Vec<super::KvEvent>,
    ) {
        let key = |id: PageId| self.keys[(id - 1) as usize];
        out.push(super::KvEvent::AllCleared {
            medium: self.config.name.clone(),
        });
        for (_, parent, ns, ids, tokens) in self.tree.nodes_by_depth() {
            out.push(super::KvEvent::Stored {
                keys: ids.iter().map(|&id| key(id)).collect(),
                parent: self.tree.last_page(parent).map(key),
                namespace: label(ns),
                pages: ids.iter().map(|&id| id - 1).collect(),
                medium: self.config.name.clone(),
                tokens: tokens.to_vec(),
            });
        }
    }

    pub(super) fn new(config: TierConfig, page_size: usize) -> KvResult<Self> {
        let n = config.num_slots;
        let stats = TierStats {
            name: config.name.clone(),
            num_slots: n,
            ..TierStats::default()
        };
        // Large tiers must never abort the process: every per-slot array is allocated fallibly.
        // The largest first, so an impossible size fails before anything is filled.
        let what = format!("lower tier {:?}", config.name);
        let keys = try_boxed_slice(n, &what, |_| [0; 16])?.into_vec();
        let free = try_boxed_slice(n, &what, |i| (n - 1 - i) as u32)?.into_vec();
        let bad = try_boxed_slice(n, &what, |_| false)?.into_vec();
        Ok(Self {
            tree: RadixTree::new(page_size, EvictionPolicy::Lru)?,
            free,
            keys,
            bad,
            num_bad: 0,
            storing: HashSet::new(),
            config,
            stats,
        })
    }

    /// Usable pages of the tier's longest match of `tokens`: the match, stopped before a bad
    /// slot. No side effects.
    fn usable_prefix(&self, ns: Namespace, tokens: &[u32]) -> usize {
        if self.num_bad == 0 {
            return self.tree.peek_prefix_len(ns, tokens);
        }
        let mut ids = Vec::new();
        self.tree.peek_prefix_pages(ns, tokens, &mut ids);
        ids.iter()
            .position(|&id| self.bad[(id - 1) as usize])
            .unwrap_or(ids.len())
    }

    /// Take `n` free slots, evicting the tier's evictable slots if short; None (nothing taken or
    /// evicted) if even that is not enough.
    fn take_slots(
        &mut self,
        n: usize,
        now: u64,
        emptied: &mut Vec<Namespace>,
        evicted_out: &mut Vec<(u32, PageKey)>,
    ) -> Option<Vec<u32>> {
        if self.free.len() < n {
            let short = n - self.free.len();
            if short > self.tree.num_evictable_pages() {
                return None;
            }
            let mut evicted = Vec::new();
            self.tree.evict(short, now, &mut evicted);
            self.stats.num_evicted_slots += evicted.len() as u64;
            for id in evicted {
                evicted_out.push((id - 1, self.keys[(id - 1) as usize]));
                self.release_slot(id - 1);
            }
            self.tree.take_emptied_namespaces(emptied);
        }
        if self.free.len() < n {
            return None;
        }
        Some(self.free.split_off(self.free.len() - n))
    }

    fn release_slot(&mut self, slot: u32) {
        self.clear_bad(slot);
        self.free.push(slot);
    }

    /// `slot` is not bad (any more).
    fn clear_bad(&mut self, slot: u32) {
        if std::mem::take(&mut self.bad[slot as usize]) {
            self.num_bad -= 1;
        }
    }

    pub(super) fn stats(&self) -> TierStats {
        let cached = self.tree.num_cached_pages();
        TierStats {
            num_slots_cached: cached,
            num_slots_bad: self.num_bad,
            num_slots_free: self.free.len(),
            num_slots_in_flight: self.config.num_slots - cached - self.free.len(),
            num_slots_locked: self.tree.num_locked_pages(),
            ..self.stats.clone()
        }
    }

    /// Drop every evictable slot (`reset_prefix_cache`); returns how many.
    pub(super) fn clear(
        &mut self,
        now: u64,
        emptied: &mut Vec<Namespace>,
        evicted_out: &mut Vec<(u32, PageKey)>,
    ) -> usize {
        self.tree.clear_pins();
        let mut evicted = Vec::new();
        let n = self.tree.evict(usize::MAX, now, &mut evicted);
        for id in evicted {
            evicted_out.push((id - 1, self.keys[(id - 1) as usize]));
            self.release_slot(id - 1);
        }
        self.tree.take_emptied_namespaces(emptied);
        n
    }

    /// Brute-force checks: free, cached and in-flight slots partition the tier; keys of pages in
    /// flight are distinct.
    pub(super) fn check(&self, in_flight: &[u32]) -> Result<(), String> {
        self.tree.check_invariants()?;
        let n = self.config.num_slots;
        let mut owner = vec![0u8; n];
        let mut claim = |slot: u32, what: u8| -> Result<(), String> {
            let s = slot as usize;
            if s >= n {
                return Err(format!(
                    "tier {}: slot {slot} out of range",
                    self.config.name
                ));
            }
            if owner[s] != 0 {
                return Err(format!(
                    "tier {}: slot {slot} owned twice ({} and {what})",
                    self.config.name, owner[s]
                ));
            }
            owner[s] = what;
            Ok(())
        };
        for &s in &self.free {
            claim(s, 1)?;
        }
        for id in self.tree.pages() {
            claim(id - 1, 2)?;
        }
        for &s in in_flight {
            claim(s, 3)?;
        }
        if let Some(s) = owner.iter().position(|&o| o == 0) {
            return Err(format!("tier {}: slot {s} is lost", self.config.name));
        }
        let bad = self.bad.iter().filter(|&&b| b).count();
        if bad != self.num_bad {
            return Err(format!("tier {}: bad count drifted", self.config.name));
        }
        Ok(())
    }
}

/// A store in flight: HBM pages `pages` (positions `first..first + pages.len()` of the path
/// `tokens`) into `slots` of tier `tier`.
#[derive(Debug)]
pub(super) struct StoreOp {
    tier: usize,
    ns: Namespace,
    /// The path's tokens, from the root to the last stored page.
    tokens: Vec<u32>,
    first: usize,
    pages: Vec<PageId>,
    slots: Vec<u32>,
    /// Keys of the stored pages, and the key of the page before the first.
    keys: Vec<PageKey>,
    parent: PageKey,
    /// HBM node locked (the stored pages' path).
    hbm_node: NodeId,
    /// Tier node locked (the parent copies' path), ending `tier_first` pages from the root (the
    /// pages from there to `first` are earlier stores' in flight when this one was made).
    tier_node: NodeId,
    tier_first: usize,
    /// Leading pages of the path keyed in the public namespace (every page for a public op): the
    /// tier path the op lands on must be in the same namespaces.
    public: usize,
}

/// The loads of one admission, in flight: page `first + i` of sequence `seq` comes from slot
/// `slots[i]` of tier `tiers[i]` into HBM page `pages[i]`, as op `base + i`.
#[derive(Debug)]
pub(super) struct LoadGroup {
    seq: SeqId,
    admission: u64,
    first: usize,
    tiers: Vec<u8>,
    slots: Vec<u32>,
    pages: Vec<PageId>,
    /// Whether each load completed (its page reference and slot lock released).
    done: Vec<bool>,
    pending: usize,
    /// Tier nodes locked for the group (one lock per tier used), released when all complete.
    tier_nodes: Vec<(usize, NodeId)>,
    taken: bool,
}

/// Transfer ops: queued (not taken yet) and in flight (taken, not completed). Op ids are never
/// reused; an admission's loads take consecutive ids.
#[derive(Debug, Default)]
pub(super) struct Transfers {
    /// Store ops by id, and whether taken.
    pub(super) stores: HashMap<u64, (StoreOp, bool), FxBuildHasher>,
    /// Load groups by their first op id.
    pub(super) loads: BTreeMap<u64, LoadGroup>,
    /// Ops not taken yet, in queue order: a store's id, or a load group's first id.
    pub(super) queued: Vec<u64>,
    /// Store ops completed OK before the store of the page they follow (a mover that finishes
    /// batches out of order): kept in flight until that store settles, then finished.
    pub(super) waiting: HashSet<u64>,
    pub(super) next_op: u64,
    pub(super) next_admission: u64,
}

impl Transfers {
    /// The load group holding op `id`, and the op's index in it.
    fn load_of(&self, id: u64) -> Option<(u64, usize)> {
        let (&base, g) = self.loads.range(..=id).next_back()?;
        let i = (id - base) as usize;
        (i < g.pages.len()).then_some((base, i))
    }
}

/// The loads of one admission (a sequence is not ready while it has some).
#[derive(Clone, Debug)]
pub(super) struct Loading {
    pub(super) admission: u64,
    /// Pages cached in HBM at admission (the loads fill `first..end`).
    pub(super) first: usize,
    pub(super) end: usize,
    /// Loads not completed yet.
    pub(super) pending: usize,
    /// The first page whose load failed (`end` if none).
    pub(super) failed_at: usize,
    /// The tier of each loaded page, `[end - first]`.
    pub(super) tiers: Vec<u8>,
    /// Pages `0..public_end` are a public prefix: the HBM hit's (all public) and the loads from
    /// public tier nodes after it; they join the HBM tree as public pages (`first` if none loads).
    pub(super) public_end: usize,
}

/// One store row of a [`TransferBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRow {
    pub op: u64,
    pub tier: usize,
    pub page: PageId,
    pub slot: u32,
    pub key: PageKey,
    pub parent_key: PageKey,
    /// The page's tokens (`page_size`).
    pub tokens: Vec<u32>,
    /// The namespace name (None: default; `"*"`: public).
    pub namespace: Option<String>,
}

/// One load row of a [`TransferBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadRow {
    pub op: u64,
    pub tier: usize,
    pub slot: u32,
    pub page: PageId,
    pub key: PageKey,
}

/// Transfers for the mover: every row of one store op shares its op id (the op succeeds or
/// fails as a whole); each load is its own op.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferBatch {
    pub stores: Vec<StoreRow>,
    pub loads: Vec<LoadRow>,
}

/// Why `offer_stores` is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Trigger {
    /// Pages just cached, with the caching priority; `fresh`: the first page of the path this
    /// caching added (those before it were cached, and offered, before). A tier that lacks pages
    /// before `fresh` (it evicted them since) refills that gap only from free slots: making room
    /// for it would evict another path's copies, which their next page would store again, and
    /// two sequences growing in a full tier would copy each other's tails back and forth.
    Cached { priority: i32, fresh: usize },
    /// Pages just matched by a prefix hit.
    Hit,
    /// Pages just pinned.
    Pinned,
    /// A sequence swapped out by its scheduler (`offload`): stored whatever the policy.
    Offload,
}

/// A page that passed a lower tier's checks in `restore_tier`.
#[derive(Clone, Debug)]
pub struct RestoredPage {
    pub slot: u32,
    pub key: PageKey,
    pub parent_key: PageKey,
    pub namespace: Option<String>,
    pub tokens: Vec<u32>,
}

/// What `restore_tier` made of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// The index holds the page in its slot now.
    Accepted,
    /// Its parent key is neither this cache's root key nor another entry's key: a page made under
    /// another fingerprint, or one whose parent's file is gone.
    UnknownParent,
    /// Its parent is another entry, which was not restored.
    ParentRefused,
    /// Its key is not what this cache computes from its parent key, namespace and tokens.
    KeyMismatch,
    /// It continues a page of another namespace (only a public page may be continued by another).
    CrossesNamespace,
    /// Its slot holds another page already.
    SlotInUse,
    /// A page restored already (another slot holds the same key): its branch goes on from there.
    Duplicate,
    /// The tier's index could not take it.
    IndexRefused,
}

impl RestoreOutcome {
    /// The outcome's name, as Python gets it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::UnknownParent => "unknown_parent",
            Self::ParentRefused => "parent_refused",
            Self::KeyMismatch => "key_mismatch",
            Self::CrossesNamespace => "crosses_namespace",
            Self::SlotInUse => "slot_in_use",
            Self::Duplicate => "duplicate",
            Self::IndexRefused => "index_refused",
        }
    }
}

impl KVCacheManager {
    /// Names of the lower tiers, in order (index = a transfer row's `tier`).
    pub fn tier_names(&self) -> Vec<String> {
        let st = self.state.lock();
        st.tiers.iter().map(|t| t.config.name.clone()).collect()
    }

    /// Tokens of the longest prefix of `tokens` an admission would find now, per medium
    /// (`[HBM, tier 0, ...]`, as [`hit_tokens`](Self::hit_tokens) would report them), without side
    /// effects: nothing touched, locked or loaded. The whole of `tokens` is looked up (an
    /// admission looks up its prompt but the last token).
    pub fn peek_hit_tokens(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<usize> {
        let st = self.state.lock();
        let ns = st
            .known_namespace(namespace)
            .unwrap_or(super::namespace::UNSEEN_NAMESPACE);
        // With KV-cache groups (no lower tiers then), the hit every group allows, as an admission.
        let hbm = if st.groups.active() {
            self.peek_group_hit(&st, ns, tokens).0
        } else {
            st.tree.peek_prefix_len(ns, tokens)
        };
        let mut out = vec![0; 1 + st.tiers.len()];
        out[0] = hbm * self.page_size;
        if !st.tiers.is_empty() {
            for t in self.plan_loads(&st, ns, tokens, hbm) {
                out[1 + t as usize] += self.page_size;
            }
        }
        out
    }

    /// Store the cached full pages of `seq_id` to every lower tier that lacks them, whatever the
    /// store policy: a scheduler swapping the sequence out before it frees it (its pages then stay
    /// locked in HBM until their stores complete, and a later admission of its tokens loads them
    /// back). Returns the pages of the sequence now stored or in flight in the first tier (0 with
    /// no tier, or nothing cached). `UnknownSequence` / not ready: nothing changed.
    pub fn offload(&self, seq_id: SeqId, now: u64) -> KvResult<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let seq = super::ready(&st.seqs, seq_id)?;
        let n = seq.num_inserted_pages.min(seq.lock_pages);
        if st.tiers.is_empty() || n == 0 {
            return Ok(0);
        }
        self.offer_seq_stores(st, seq_id, n, Trigger::Offload, now)?;
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let tier = &st.tiers[0];
        let visible = tier.usable_prefix(seq.ns, &seq.tokens[..n * self.page_size]);
        // The stores just offered computed the keys of the pages the tiers lacked.
        let keys = seq.keys.get(visible..n).unwrap_or(&[]);
        let in_flight = keys
            .iter()
            .take_while(|&k| tier.storing.contains(k))
            .count();
        Ok(visible + in_flight)
    }

    /// Per-tier counters and occupancy.
    pub fn tier_stats(&self) -> Vec<TierStats> {
        let st = self.state.lock();
        st.tiers.iter().map(Tier::stats).collect()
    }

    /// Whether `seq_id`'s prefix is in HBM (no load in flight): its page table is valid.
    pub fn is_ready(&self, seq_id: SeqId) -> KvResult<bool> {
        let st = self.state.lock();
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        Ok(seq.loading.is_none())
    }

    /// Tokens of `seq_id`'s prefix hit per medium: `[HBM, tier 0, tier 1, ...]`. While loads are in
    /// flight the lower tiers' counts are what is being loaded; once ready, what was loaded (a
    /// failed load cut the hit before it).
    pub fn hit_tokens(&self, seq_id: SeqId) -> KvResult<Vec<usize>> {
        let st = self.state.lock();
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        Ok(seq.hit.clone())
    }

    /// Queued transfers (stores, loads, or both), now in flight: the mover copies the bytes and
    /// reports each op with [`complete_transfers`](Self::complete_transfers).
    ///
    /// Stores copy pages cached by `add_sequence`/`append`, whose K/V the engine writes in the
    /// step that follows: take stores only *after* that step. Loads fill the pages of sequences
    /// admitted with a lower-tier hit (not ready until they complete): take them any time, e.g.
    /// before the step to overlap them with it. One call of both after every step is always
    /// right (a loading sequence then joins the next step).
    pub fn take_transfers(&self, stores: bool, loads: bool) -> TransferBatch {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut batch = TransferBatch::default();
        let ps = self.page_size;
        let queued = std::mem::take(&mut st.transfers.queued);
        let mut kept = Vec::new();
        for id in queued {
            if let Some((op, _)) = st.transfers.stores.get(&id) {
                if !stores {
                    kept.push(id);
                    continue;
                }
                let name = st.namespace_label(op.ns);
                for (i, (&page, &slot)) in op.pages.iter().zip(&op.slots).enumerate() {
                    let at = (op.first + i) * ps;
                    batch.stores.push(StoreRow {
                        op: id,
                        tier: op.tier,
                        page,
                        slot,
                        key: op.keys[i],
                        parent_key: if i == 0 { op.parent } else { op.keys[i - 1] },
                        tokens: op.tokens[at..at + ps].to_vec(),
                        namespace: name.clone(),
                    });
                }
                if let Some((_, taken)) = st.transfers.stores.get_mut(&id) {
                    *taken = true;
                }
            } else if let Some(g) = st.transfers.loads.get_mut(&id) {
                if !loads {
                    kept.push(id);
                    continue;
                }
                g.taken = true;
                for i in 0..g.pages.len() {
                    let (tier, slot) = (g.tiers[i] as usize, g.slots[i]);
                    batch.loads.push(LoadRow {
                        op: id + i as u64,
                        tier,
                        slot,
                        page: g.pages[i],
                        key: st.tiers[tier].keys[slot as usize],
                    });
                }
            }
        }
        st.transfers.queued = kept;
        batch
    }

    /// Check, changing nothing, that every op of `op_ids` is a taken transfer still in flight
    /// (listed once): what [`complete_transfers`](Self::complete_transfers) requires. A mover
    /// asks before it copies a batch's bytes: a batch completed already has its pages and slots
    /// back with the cache (maybe another sequence's now), so copying it would overwrite them.
    pub fn check_transfers(&self, op_ids: &[u64]) -> KvResult<()> {
        Self::check_in_flight(&self.state.lock(), op_ids, "check_transfers")
    }

    fn check_in_flight(st: &State, op_ids: &[u64], what: &str) -> KvResult<()> {
        let mut seen = HashSet::with_capacity(op_ids.len());
        for &id in op_ids {
            let taken = match st.transfers.stores.get(&id) {
                Some(_) if st.transfers.waiting.contains(&id) => None, // completed already
                Some(&(_, taken)) => Some(taken),
                None => st
                    .transfers
                    .load_of(id)
                    .filter(|&(base, i)| !st.transfers.loads[&base].done[i])
                    .map(|(base, _)| st.transfers.loads[&base].taken),
            };
            let why = match taken {
                None => "is not a transfer in flight",
                Some(false) => "was not taken (take_transfers) yet",
                Some(true) if !seen.insert(id) => "is listed twice",
                Some(true) => continue,
            };
            return Err(KvError::InvalidArgument(format!("{what}: op {id} {why}")));
        }
        Ok(())
    }

    /// Report the outcome of transfers taken with [`take_transfers`](Self::take_transfers):
    /// `ok[i]` for op `op_ids[i]`. A store completed OK becomes visible in its tier; a failed one
    /// frees its slots. A load completed OK makes its page part of the sequence's hit; a failed one
    /// cuts the hit before it and marks the slot bad. Err (nothing changed) for an id not in
    /// flight, listed twice, or lengths that disagree.
    pub fn complete_transfers(&self, op_ids: &[u64], ok: &[bool], now: u64) -> KvResult<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if op_ids.len() != ok.len() {
            return Err(KvError::InvalidArgument(format!(
                "complete_transfers: {} op ids but {} outcomes",
                op_ids.len(),
                ok.len()
            )));
        }
        Self::check_in_flight(st, op_ids, "complete_transfers")?;
        let mut released = Vec::new();
        for (&id, &good) in op_ids.iter().zip(ok) {
            if let Some((op, _)) = st.transfers.stores.get(&id) {
                // Its pages continue the path of the page before them: if that page's store is
                // still in flight, this one waits for it (its slots stay in flight meanwhile).
                if good && op.first > 0 && st.tiers[op.tier].storing.contains(&op.parent) {
                    st.transfers.waiting.insert(id);
                    continue;
                }
                let tier = op.tier;
                let (op, _) = st.transfers.stores.remove(&id).ok_or_else(|| {
                    internal(KvError::InvalidArgument(format!("op {id} vanished")))
                })?;
                self.finish_store(st, op, good, now)?;
                self.finish_waiting_stores(st, tier, now)?;
                continue;
            }
            let (base, i) = st
                .transfers
                .load_of(id)
                .ok_or_else(|| internal(KvError::InvalidArgument(format!("op {id} vanished"))))?;
            self.finish_load(st, base, i, good, now, &mut released)?;
        }
        // The loads' own references on their HBM pages (each sequence holds its own, if live).
        self.release(st, &released)
    }

    /// Finish the waiting stores of `tier` whose parent page's store has settled (in take order,
    /// until none is left ready: one may be the parent of the next).
    fn finish_waiting_stores(&self, st: &mut State, tier: usize, now: u64) -> KvResult<()> {
        loop {
            let mut ready: Vec<u64> = st
                .transfers
                .waiting
                .iter()
                .copied()
                .filter(|id| {
                    st.transfers.stores.get(id).is_some_and(|(op, _)| {
                        op.tier == tier && !st.tiers[tier].storing.contains(&op.parent)
                    })
                })
                .collect();
            if ready.is_empty() {
                return Ok(());
            }
            ready.sort_unstable();
            for id in ready {
                st.transfers.waiting.remove(&id);
                let (op, _) = st.transfers.stores.remove(&id).ok_or_else(|| {
                    internal(KvError::InvalidArgument(format!("op {id} vanished")))
                })?;
                self.finish_store(st, op, true, now)?;
            }
        }
    }

    fn finish_store(&self, st: &mut State, s: StoreOp, good: bool, now: u64) -> KvResult<()> {
        let ps = self.page_size;
        let tier = &mut st.tiers[s.tier];
        for key in &s.keys {
            tier.storing.remove(key);
        }
        let n = s.slots.len() as u64;
        let mut leftover = s.slots.clone();
        // The op's pages from this index on were adopted (the tier kept its own copies before),
        // and the key of the page before them on the tier's path (None: they start at the root).
        let mut stored_from = None;
        let mut parent = None;
        let mut landed = None; // the tier node now ending at this op's last page
        if good {
            // The parent copies are locked: the tier still holds the first `tier_first` pages, up
            // to `tier_node`; the earlier stores' pages after them (to `first`) if they succeeded.
            // The new pages continue the path from `tier_node` (a walk of what it adds, not of the
            // whole path: a long sequence stored page by page stays one long tier node).
            let base = s.tier_first;
            let below = &s.tokens[base * ps..];
            // What the tier holds below its locked node of the pages up to the op's last one, and
            // whether it is in the namespaces their keys chain over (another store may have landed
            // the same tokens in another namespace meanwhile: pages keyed in one chain never hang
            // below another's). Above the node, the path was checked when the op was taken.
            let (have, have_public) = tier
                .tree
                .peek_from_public(s.ns, s.tier_node, below)
                .map_err(internal)?;
            let want_public = if s.ns == PUBLIC_NAMESPACE {
                have
            } else {
                s.public.saturating_sub(base).min(have)
            };
            if have >= s.first - base && have_public == want_public {
                // Positions before `first` are cached already: their ids are not read.
                let mut path: Vec<PageId> = vec![crate::NULL_PAGE; s.first - base];
                path.extend(s.slots.iter().map(|&slot| slot + 1));
                let ins = tier
                    .tree
                    .extend(s.ns, s.tier_node, below, &path, 0, now)
                    .map_err(internal)?;
                landed = Some(ins.node);
                let taken: HashSet<u32> = path[ins.adopted()].iter().map(|&id| id - 1).collect();
                for (i, &slot) in s.slots.iter().enumerate() {
                    if taken.contains(&slot) {
                        tier.keys[slot as usize] = s.keys[i];
                    }
                }
                leftover.retain(|slot| !taken.contains(slot));
                tier.stats.num_stored_pages += taken.len() as u64;
                if !taken.is_empty() {
                    stored_from = Some(s.slots.len() - taken.len());
                    // The tier's own key of the page before (a tenant's run over a public prefix
                    // follows a page keyed in the public namespace, not the tenant's chain).
                    let mut before = Vec::with_capacity(taken.len() + 1);
                    tier.tree.path_pages(ins.node, taken.len() + 1, &mut before);
                    if before.len() > taken.len() {
                        parent = Some(tier.keys[(before[0].0 - 1) as usize]);
                    }
                }
            } else {
                tier.stats.num_store_failed_pages += n;
            }
        } else {
            tier.stats.num_store_failed_pages += n;
        }
        for slot in leftover {
            tier.release_slot(slot);
        }
        tier.tree.unlock(s.tier_node).map_err(internal)?;
        if let (Some(node), Some(&last)) = (landed, s.keys.last()) {
            self.hold_for_continuations(st, s.tier, node, s.first + s.slots.len(), last)?;
        }
        st.tree.unlock(s.hbm_node).map_err(internal)?;
        if let Some(from) = stored_from {
            let first = s.first + from;
            let tokens = &s.tokens[first * ps..(s.first + s.slots.len()) * ps];
            record_tier_stored(
                st,
                s.tier,
                s.ns,
                &s.keys[from..],
                parent,
                &s.slots[from..],
                tokens,
            );
        }
        st.remove_live(s.ns);
        Ok(())
    }

    /// Stores in flight that continue the op that just landed (its last page `last`, ending at
    /// page `end`, now in tier node `node`): they were taken while it was in flight, so their tier
    /// locks end above it, and making room for other stores could evict the pages they extend
    /// (their copies were then dropped although stored). Each now locks `node` instead.
    fn hold_for_continuations(
        &self,
        st: &mut State,
        tier: usize,
        node: NodeId,
        end: usize,
        last: PageKey,
    ) -> KvResult<()> {
        let State {
            tiers, transfers, ..
        } = st;
        for (op, _) in transfers.stores.values_mut() {
            if op.tier == tier && op.first == end && op.parent == last && op.tier_first < end {
                tiers[tier].tree.lock(node).map_err(internal)?;
                let old = std::mem::replace(&mut op.tier_node, node);
                op.tier_first = end;
                tiers[tier].tree.unlock(old).map_err(internal)?;
            }
        }
        Ok(())
    }

    fn finish_load(
        &self,
        st: &mut State,
        base: u64,
        i: usize,
        good: bool,
        now: u64,
        released: &mut Vec<PageId>,
    ) -> KvResult<()> {
        let g = st
            .transfers
            .loads
            .get_mut(&base)
            .ok_or_else(|| internal(KvError::InvalidArgument("load group vanished".into())))?;
        g.done[i] = true;
        g.pending -= 1;
        released.push(g.pages[i]);
        let (seq_id, admission, index) = (g.seq, g.admission, g.first + i);
        let (t, slot) = (g.tiers[i] as usize, g.slots[i]);
        if g.pending == 0 {
            let g =
                st.transfers.loads.remove(&base).ok_or_else(|| {
                    internal(KvError::InvalidArgument("load group vanished".into()))
                })?;
            for (t, node) in g.tier_nodes {
                st.tiers[t].tree.unlock(node).map_err(internal)?;
            }
        }
        let tier = &mut st.tiers[t];
        if good {
            tier.stats.num_loaded_pages += 1;
        } else {
            tier.stats.num_load_failed_pages += 1;
            if !std::mem::replace(&mut tier.bad[slot as usize], true) {
                tier.num_bad += 1;
            }
        }
        let Some(seq) = st.seqs.get_mut(&seq_id) else {
            return Ok(());
        };
        let Some(loading) = seq.loading.as_mut().filter(|x| x.admission == admission) else {
            return Ok(());
        };
        loading.pending -= 1;
        if !good {
            loading.failed_at = loading.failed_at.min(index);
        }
        if loading.pending == 0 {
            self.finish_loading(st, seq_id, now)?;
        }
        Ok(())
    }

    /// Every load of `seq_id`'s admission completed: its hit ends before the first failed page;
    /// the loaded pages join the HBM tree, then the prompt's pages as `add_sequence` would have.
    fn finish_loading(&self, st: &mut State, seq_id: SeqId, now: u64) -> KvResult<()> {
        let ps = self.page_size;
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let loading = seq
            .loading
            .take()
            .ok_or_else(|| internal(unknown(seq_id)))?;
        let valid = loading.failed_at.min(loading.end);
        if valid < loading.end {
            self.drop_bad_slots(st, seq_id, loading.end)?;
        }
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        seq.num_committed = valid * ps;
        for h in seq.hit.iter_mut().skip(1) {
            *h = 0;
        }
        for &t in &loading.tiers[..valid - loading.first] {
            seq.hit[1 + t as usize] += ps;
        }
        let auto_cache = seq.auto_cache;
        let full_pages = seq.slots.min(seq.tokens.len()) / ps;
        for (t, tokens) in seq.hit.clone().into_iter().enumerate().skip(1) {
            st.tiers[t - 1].stats.hit_tokens += tokens as u64;
        }
        st.stats.prefix_hit_tokens += ((valid - loading.first) * ps) as u64;
        // Pages loaded from a tier's public prefix join HBM as public pages (shared by every
        // namespace, keyed as the public prefix they are), the namespace's own after them.
        let public_end = loading.public_end.min(valid);
        let seq = st.seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if public_end > loading.first && seq.bounds.is_none() && st.groups.num_groups() == 1 {
            let own = std::mem::replace(&mut seq.ns, PUBLIC_NAMESPACE);
            let cached = self.cache_full_pages(st, seq_id, public_end, now);
            if let Some(seq) = st.seqs.get_mut(&seq_id) {
                seq.ns = own;
            }
            cached?;
        }
        self.cache_full_pages(st, seq_id, valid, now)?;
        if auto_cache {
            self.cache_full_pages(st, seq_id, full_pages, now)?;
        }
        Ok(())
    }

    /// A load of `seq_id`'s admission failed: in each tier, the first bad slot on its path (of
    /// `end` pages) is dropped with what follows it, when they sit in an evictable leaf. Its copy
    /// is gone or unreadable, and a bad slot that kept its place blocked the path for good: the
    /// recomputed page was never stored there again, and a lookup that found the page in a shared
    /// store could not index it (until eviction, which free slots never need). A bad slot with
    /// children or locks keeps its place until it is evicted, or until a lookup finds its key in
    /// the tier again ([`mark_tier_pages`](Self::mark_tier_pages)).
    fn drop_bad_slots(&self, st: &mut State, seq_id: SeqId, end: usize) -> KvResult<()> {
        let ps = self.page_size;
        let seq = st.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let ns = seq.ns;
        let tokens = seq.tokens[..(end * ps).min(seq.tokens.len())].to_vec();
        let mut emptied = Vec::new();
        for t in 0..st.tiers.len() {
            let tier = &mut st.tiers[t];
            if tier.num_bad == 0 {
                continue;
            }
            let usable = tier.usable_prefix(ns, &tokens);
            if tier.tree.peek_prefix_len(ns, &tokens) <= usable {
                continue; // no bad slot on this path
            }
            let Some(ids) = tier.tree.drop_leaf_from(ns, &tokens, usable) else {
                continue;
            };
            let mut dropped = Vec::with_capacity(ids.len());
            for id in ids {
                let slot = id - 1;
                dropped.push((slot, tier.keys[slot as usize]));
                tier.release_slot(slot);
            }
            tier.stats.num_dropped_bad_slots += dropped.len() as u64;
            tier.tree.take_emptied_namespaces(&mut emptied);
            record_tier_removed(st, t, &dropped);
        }
        for ns in emptied {
            st.forget_if_unused(ns);
        }
        Ok(())
    }

    /// Cancel the loads of `seq_id` not taken yet (the sequence is being freed): their pages and
    /// slots are released now; loads already taken complete later and find no sequence.
    pub(super) fn cancel_loads(&self, st: &mut State, seq_id: SeqId) -> KvResult<()> {
        let loads = &st.transfers.loads;
        let mut cancelled = Vec::new();
        st.transfers.queued.retain(|id| {
            let hit = loads.get(id).is_some_and(|g| g.seq == seq_id && !g.taken);
            if hit {
                cancelled.push(*id);
            }
            !hit
        });
        for base in cancelled {
            if let Some(g) = st.transfers.loads.remove(&base) {
                for (t, node) in g.tier_nodes {
                    st.tiers[t].tree.unlock(node).map_err(internal)?;
                }
                self.release(st, &g.pages)?;
            }
        }
        Ok(())
    }

    /// The admission's plan across tiers: for HBM-cached `hbm_pages` of `lookup`, the tier of each
    /// following page that a lower tier holds (the first tier, in order, whose usable prefix
    /// reaches it). No side effects.
    pub(super) fn plan_loads(
        &self,
        st: &State,
        ns: Namespace,
        lookup: &[u32],
        hbm_pages: usize,
    ) -> Vec<u8> {
        let mut plan = Vec::new();
        let mut reach = Vec::with_capacity(st.tiers.len());
        let mut deepest = hbm_pages;
        for tier in &st.tiers {
            let n = tier.usable_prefix(ns, lookup);
            reach.push(n);
            deepest = deepest.max(n);
        }
        // Runs: from page i, the first tier reaching past i serves every page up to its reach
        // (the tiers before it all end at or before i).
        let mut i = hbm_pages;
        while i < deepest {
            let Some(t) = reach.iter().position(|&n| n > i) else {
                break;
            };
            plan.resize(plan.len() + (reach[t] - i), t as u8);
            i = reach[t];
        }
        plan
    }

    /// Queue the loads of `plan` (pages `first..` of the admission of `seq_id`) into `pages`
    /// (already the sequence's): lock each slot's tier path, hold each HBM page.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_loads(
        &self,
        st: &mut State,
        seq_id: SeqId,
        ns: Namespace,
        lookup: &[u32],
        first: usize,
        plan: &[u8],
        pages: &[PageId],
        priority: i32,
        hbm_public: bool,
        now: u64,
    ) -> KvResult<super::tiers::Loading> {
        let ps = self.page_size;
        let end = first + plan.len();
        // A public prefix continued from the tiers' public nodes stays public in HBM.
        let mut public_end = first;
        if hbm_public && ns != PUBLIC_NAMESPACE {
            let mut paths: Vec<Option<Vec<(PageId, Namespace)>>> = vec![None; st.tiers.len()];
            for (i, &t) in plan.iter().enumerate() {
                let path = paths[t as usize].get_or_insert_with(|| {
                    let mut p = Vec::new();
                    st.tiers[t as usize]
                        .tree
                        .peek_prefix_pages_ns(ns, &lookup[..end * ps], &mut p);
                    p
                });
                if path.get(first + i).map(|&(_, x)| x) != Some(PUBLIC_NAMESPACE) {
                    break;
                }
                public_end += 1;
            }
        }
        let admission = st.transfers.next_admission;
        st.transfers.next_admission += 1;
        let mut slots = vec![0u32; plan.len()];
        let mut tier_nodes = Vec::new();
        for t in 0..st.tiers.len() {
            let Some(last) = plan.iter().rposition(|&x| x as usize == t) else {
                continue;
            };
            let upto = first + last + 1;
            let tier = &mut st.tiers[t];
            let mut ids = Vec::with_capacity(upto);
            let m = tier
                .tree
                .match_prefix(ns, &lookup[..upto * ps], priority, now, &mut ids);
            if m.num_pages != upto {
                return Err(internal(KvError::InvalidArgument(format!(
                    "tier {t} matched {} pages, planned {upto}",
                    m.num_pages
                ))));
            }
            tier.tree.lock(m.node).map_err(internal)?;
            tier_nodes.push((t, m.node));
            for (i, &x) in plan.iter().enumerate() {
                if x as usize == t {
                    slots[i] = ids[first + i] - 1;
                }
            }
        }
        let base = st.transfers.next_op;
        st.transfers.next_op += plan.len() as u64;
        st.transfers.loads.insert(
            base,
            LoadGroup {
                seq: seq_id,
                admission,
                first,
                tiers: plan.to_vec(),
                slots,
                pages: pages[first..end].to_vec(),
                done: vec![false; plan.len()],
                pending: plan.len(),
                tier_nodes,
                taken: false,
            },
        );
        st.transfers.queued.push(base);
        self.alloc
            .retain_serialized(&pages[first..end])
            .map_err(internal)?;
        Ok(Loading {
            admission,
            first,
            end,
            pending: plan.len(),
            failed_at: end,
            tiers: plan.to_vec(),
            public_end,
        })
    }

    /// Offer pages `0..n` of a path to the lower tiers, as the store policy decides: into each
    /// tier, the run of pages after the tier's own copies that pass the policy. `node` is the HBM
    /// node ending at page `n` of the path (`tokens` and `keys` cover at least `n` pages). The
    /// stores read the tree's pages (locked until they complete), never a sequence's private copy
    /// of the same tokens, which its sequence may free and the pool reuse meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn offer_stores(
        &self,
        st: &mut State,
        (ns, node): (Namespace, NodeId),
        tokens: &[u32],
        (keys, public): (&[PageKey], usize),
        n: usize,
        trigger: Trigger,
        now: u64,
    ) -> KvResult<()> {
        if st.tiers.is_empty() || n == 0 {
            return Ok(());
        }
        // A namespace's path over a public prefix (`public` pages, held by public nodes, as its
        // `keys` were computed): the public pages are stored as the public namespace's (under their
        // public keys, once for every tenant), the namespace's own pages after them, in the tier
        // as in HBM.
        let public = if ns == PUBLIC_NAMESPACE {
            0
        } else {
            public.min(n)
        };
        if public > 0 {
            let public_node = st.tree.cut_path(node, public).map_err(internal)?;
            let public_keys = &keys[..public];
            self.offer_stores(
                st,
                (PUBLIC_NAMESPACE, public_node),
                tokens,
                (public_keys, public),
                public,
                trigger,
                now,
            )?;
        }
        let ps = self.page_size;
        let hits = st.tree.node_hits(node).unwrap_or(0);
        let mut emptied = Vec::new();
        for t in 0..st.tiers.len() {
            let tier = &st.tiers[t];
            // The usable prefix, and its pages that public nodes hold (one lookup without bad slots).
            let (visible, visible_public) = if tier.num_bad == 0 {
                tier.tree.peek_prefix_public(ns, &tokens[..n * ps])
            } else {
                let visible = tier.usable_prefix(ns, &tokens[..n * ps]);
                let path = &tokens[..visible * ps];
                (visible, tier.tree.peek_prefix_public(ns, path).1)
            };
            // A bad slot ends the usable prefix but still holds its place: nothing to store there.
            if visible < n && tier.tree.peek_prefix_len(ns, &tokens[..(visible + 1) * ps]) > visible
            {
                continue;
            }
            // Pages of this path already in flight to the tier (an earlier store of this call or
            // step): the new store continues after them, and completes after them (op order).
            let mut a = visible;
            while a < n && tier.storing.contains(&keys[a]) {
                a += 1;
            }
            // The tier lacks the public pages this namespace's pages continue (not stored, not in
            // flight), or holds the path's first pages in other namespaces than HBM does (the
            // namespace's own copy of public tokens, or the public copy of the namespace's own):
            // pages keyed in this path's chain cannot land below pages keyed in another.
            let same = ns == PUBLIC_NAMESPACE || visible_public == public.min(visible);
            if a < public || !same {
                continue;
            }
            let bw = tier.config.bandwidth_gbps;
            let wanted = match (&st.store_policy, trigger) {
                (StorePolicy::All, _) | (_, Trigger::Offload) => n,
                (StorePolicy::Selective { min_priority, .. }, Trigger::Cached { priority, .. })
                    if priority >= *min_priority =>
                {
                    n
                }
                (StorePolicy::Selective { min_hits, .. }, Trigger::Hit) if hits >= *min_hits => n,
                (StorePolicy::Selective { .. }, Trigger::Pinned) => n,
                (StorePolicy::Selective { .. }, _) => a,
                (StorePolicy::Value(model), trig) => {
                    let h = if matches!(trig, Trigger::Cached { .. }) {
                        0
                    } else {
                        hits
                    };
                    (a..n)
                        .take_while(|&d| model.worth_storing(h, d, ps, bw))
                        .count()
                        + a
                }
            };
            // Stop before a page in flight further on (another path's store of a shared page).
            let k = (a..wanted)
                .find(|&i| tier.storing.contains(&keys[i]))
                .unwrap_or(wanted);
            if wanted > k {
                st.tiers[t].stats.num_store_skipped_in_flight += (wanted - k) as u64;
            }
            if k <= a {
                continue;
            }
            let tier = &mut st.tiers[t];
            // Lock the parent copies first: making room must not evict what the store extends.
            let tier_node = if visible == 0 {
                ROOT
            } else {
                let mut ids = Vec::new();
                tier.tree
                    .match_prefix(ns, &tokens[..visible * ps], 0, now, &mut ids)
                    .node
            };
            tier.tree.lock(tier_node).map_err(internal)?;
            // A run longer than the tier can make room for stores its leading pages (the ones
            // every longer prefix needs); the rest is skipped and counted. A gap before the pages
            // just cached is refilled from free slots only (see `Trigger::Cached`).
            let gap = matches!(trigger, Trigger::Cached { fresh, .. } if a < fresh);
            let room = if gap {
                tier.free.len()
            } else {
                tier.free.len() + tier.tree.num_evictable_pages()
            };
            let k = if k - a > room {
                tier.stats.num_store_skipped_no_room += (k - a - room) as u64;
                a + room
            } else {
                k
            };
            let mut evicted = Vec::new();
            let taken = tier.take_slots(k - a, now, &mut emptied, &mut evicted);
            record_tier_removed(st, t, &evicted);
            let tier = &mut st.tiers[t];
            let slots = match taken {
                Some(slots) if k > a => slots,
                _ => {
                    tier.tree.unlock(tier_node).map_err(internal)?;
                    tier.stats.num_store_skipped_no_room += (k - a) as u64;
                    continue;
                }
            };
            let run = &keys[a..k];
            tier.storing.extend(run.iter().copied());
            let hbm_node = st.tree.cut_path(node, k).map_err(internal)?;
            st.tree.lock(hbm_node).map_err(internal)?;
            let mut path = Vec::with_capacity(k - a);
            st.tree.path_pages(hbm_node, k - a, &mut path);
            let pages: Vec<PageId> = path.into_iter().map(|(p, _)| p).collect();
            // The namespace stays interned while its store is in flight.
            *st.namespace_seqs.entry(ns).or_default() += 1;
            let id = st.transfers.next_op;
            st.transfers.next_op += 1;
            let op = StoreOp {
                tier: t,
                ns,
                tokens: tokens[..k * ps].to_vec(),
                first: a,
                pages,
                slots,
                keys: run.to_vec(),
                parent: if a == 0 { self.root_key } else { keys[a - 1] },
                hbm_node,
                tier_node,
                tier_first: visible,
                public: if ns == PUBLIC_NAMESPACE { k } else { public },
            };
            st.transfers.stores.insert(id, (op, false));
            st.transfers.queued.push(id);
        }
        for ns in emptied {
            st.forget_if_unused(ns);
        }
        Ok(())
    }

    /// Whether some tier lacks (and is not receiving) one of pages `0..n` of `tokens` in `ns`:
    /// when none does, there is nothing to offer and no key to compute. No side effects.
    pub(super) fn tiers_lack(&self, st: &State, ns: Namespace, tokens: &[u32], n: usize) -> bool {
        let ps = self.page_size;
        st.tiers
            .iter()
            .any(|t| t.tree.peek_prefix_len(ns, &tokens[..n * ps]) < n)
    }

    /// Keys of pages `0..n` of `tokens` in `ns`, chained from the root, continuing `keys` (the
    /// keys of a prefix of them), as HBM keys a path: its first `public` pages (held by public
    /// nodes) in the public namespace, the others in `ns`, each chained from the key before it.
    /// First copied from a tier that holds the path in the same namespaces (an admission that hits
    /// a long cached prefix would otherwise hash all of it), then hashed.
    pub(super) fn extend_keys(
        &self,
        st: &State,
        ns: Namespace,
        tokens: &[u32],
        n: usize,
        keys: &mut Vec<PageKey>,
        public: usize,
    ) -> KvResult<()> {
        let ps = self.page_size;
        let public = if ns == PUBLIC_NAMESPACE {
            n
        } else {
            public.min(n)
        };
        let expected = |i: usize| if i < public { PUBLIC_NAMESPACE } else { ns };
        let mut path = Vec::new();
        // A few missing keys are hashed (a page in about 0.2 us): walking a tier's path to copy
        // them would cost a walk of the whole prefix on every page a decode fills.
        const COPY_FROM_TIERS_ABOVE: usize = 32;
        for tier in &st.tiers {
            if keys.len() + COPY_FROM_TIERS_ABOVE >= n {
                break;
            }
            path.clear();
            tier.tree
                .peek_prefix_pages_ns(ns, &tokens[..n * ps], &mut path);
            // Keys chain from the root: only a run of pages held in the namespaces this path's
            // pages are keyed in continues `keys`.
            let same = path
                .iter()
                .enumerate()
                .take_while(|&(i, &(_, x))| x == expected(i))
                .count();
            while keys.len() < same {
                let (id, _) = path[keys.len()];
                keys.push(tier.keys[(id - 1) as usize]);
            }
        }
        let missing = || internal(KvError::InvalidArgument("namespace without a name".into()));
        let kns = st.key_namespace(ns).ok_or_else(missing)?;
        let public_kns = st.key_namespace(PUBLIC_NAMESPACE).ok_or_else(missing)?;
        while keys.len() < n {
            let i = keys.len();
            let parent = if i == 0 { self.root_key } else { keys[i - 1] };
            let k = if i < public { public_kns } else { kns };
            keys.push(page_key(&parent, k, &tokens[i * ps..(i + 1) * ps]));
        }
        Ok(())
    }

    pub(super) fn tier_index(st: &State, tier_name: &str, op: &str) -> KvResult<usize> {
        st.tiers
            .iter()
            .position(|x| x.config.name == tier_name)
            .ok_or_else(|| {
                KvError::InvalidArgument(format!("{op}: no lower tier named {tier_name:?}"))
            })
    }

    /// The page keys of the full pages of `tokens` in `namespace`, as this cache names them (its
    /// fingerprint): what a shared tier is asked for. The first `public_pages` are keyed as a
    /// public prefix's (a shared system prompt), the rest chained from them (see
    /// [`crate::keys::page_keys_over_public`]). No side effects.
    pub fn prompt_keys(
        &self,
        tokens: &[u32],
        namespace: Option<&str>,
        public_pages: usize,
    ) -> Vec<PageKey> {
        let ns = crate::keys::KeyNamespace::of(namespace);
        let mut keys = Vec::with_capacity(tokens.len() / self.page_size);
        crate::keys::page_keys_over_public(
            &self.root_key,
            ns,
            tokens,
            self.page_size,
            public_pages,
            &mut keys,
        );
        keys
    }

    /// Leading full pages of `tokens` (in `namespace`) that tier `tier_name` indexes (usable ones:
    /// a bad slot ends it). No side effects.
    pub fn tier_prefix_len(
        &self,
        tier_name: &str,
        tokens: &[u32],
        namespace: Option<&str>,
    ) -> KvResult<usize> {
        let st = self.state.lock();
        let t = Self::tier_index(&st, tier_name, "tier_prefix_len")?;
        let ns = st
            .known_namespace(namespace)
            .unwrap_or(super::namespace::UNSEEN_NAMESPACE);
        Ok(st.tiers[t].usable_prefix(ns, tokens))
    }

    /// The bad slots on `tokens`' path in tier `t` from page `from` on (the tier was just asked
    /// for these pages' keys and holds every one of them) are good again, each only if its slot
    /// holds the very key the path chains to there (the stored key of the page before it, the
    /// namespace of the node holding it, its tokens); the walk stops at the first that does not.
    fn clear_confirmed_bad(
        &self,
        st: &mut State,
        t: usize,
        ns: Namespace,
        tokens: &[u32],
        from: usize,
    ) {
        let ps = self.page_size;
        let mut path = Vec::new();
        st.tiers[t].tree.peek_prefix_pages_ns(ns, tokens, &mut path);
        for i in from..path.len() {
            let (id, page_ns) = path[i];
            let Some(kns) = st.key_namespace(page_ns) else {
                return;
            };
            let parent = match i {
                0 => self.root_key,
                _ => st.tiers[t].keys[(path[i - 1].0 - 1) as usize],
            };
            let key = page_key(&parent, kns, &tokens[i * ps..(i + 1) * ps]);
            let tier = &mut st.tiers[t];
            if key != tier.keys[(id - 1) as usize] {
                return;
            }
            tier.clear_bad(id - 1);
        }
    }

    /// Index the first `num_pages` full pages of `tokens` (in `namespace`) in tier `tier_name`
    /// without a transfer: the tier said it holds them (a shared tier that another instance
    /// filled; `kvcore.tiers.Mover.lookup` asks it). An admission can then load them from there;
    /// a page the tier does not hold after all fails its load (its key is checked), which cuts
    /// the hit before it: nothing wrong is read. Pages already indexed are kept; new index
    /// entries take free slots (evicting the tier's evictable ones). Returns how many pages were
    /// indexed; `InvalidArgument` (nothing changed) for an unknown tier or more pages than
    /// `tokens` holds.
    ///
    /// With `public_pages` (the keys the tier was asked for chain over that many public pages, as
    /// `prompt_keys(.., public_pages)` computes them), nothing is indexed unless the tier's path
    /// here is in those namespaces: the keys indexed are then exactly the ones asked.
    pub fn mark_tier_pages(
        &self,
        tier_name: &str,
        tokens: &[u32],
        num_pages: usize,
        namespace: Option<&str>,
        public_pages: Option<usize>,
        now: u64,
    ) -> KvResult<usize> {
        let ps = self.page_size;
        if num_pages > tokens.len() / ps {
            return Err(KvError::InvalidArgument(format!(
                "mark_tier_pages: {num_pages} pages asked, the tokens hold {} full pages",
                tokens.len() / ps
            )));
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let t = Self::tier_index(st, tier_name, "mark_tier_pages")?;
        let known = st.known_namespace(namespace);
        let ns = st.resolve_namespace(known, namespace);
        let tokens = &tokens[..num_pages * ps];
        let mut visible = st.tiers[t].usable_prefix(ns, tokens);
        let indexed = if visible < num_pages {
            st.tiers[t].tree.peek_prefix_len(ns, tokens)
        } else {
            visible
        };
        if indexed > visible {
            // Bad slots in the way, whose keys the tier says it holds again (another instance
            // stored them after their loads failed: a restarted or flushed server): good again.
            // Kept bad, they blocked the prefix for good (a bad slot with children is not dropped).
            self.clear_confirmed_bad(st, t, ns, tokens, visible);
            visible = st.tiers[t].usable_prefix(ns, tokens);
        }
        // A bad slot in the way: the tier's path there is not usable, nothing to add.
        if visible >= num_pages || indexed > visible {
            st.forget_if_unused(ns);
            return Ok(0);
        }
        let mut keys = Vec::with_capacity(num_pages);
        // Keyed as they were stored: the public pages the tier holds on this path (a shared system
        // prompt), then the namespace's own, chained from them.
        let public = if visible == 0 || ns == PUBLIC_NAMESPACE {
            0
        } else {
            st.tiers[t]
                .tree
                .peek_prefix_public(ns, &tokens[..visible * ps])
                .1
        };
        // The caller asked the tier for keys over another public prefix than the path this
        // namespace sees here (its own copy of public tokens): those keys are not these pages'.
        if let Some(asked) = public_pages.filter(|_| ns != PUBLIC_NAMESPACE) {
            if asked != public {
                st.forget_if_unused(ns);
                return Ok(0);
            }
        }
        self.extend_keys(st, ns, tokens, num_pages, &mut keys, public)?;
        let mut emptied = Vec::new();
        let mut evicted = Vec::new();
        let tier = &mut st.tiers[t];
        let mut ids = Vec::with_capacity(num_pages);
        let m = tier
            .tree
            .match_prefix(ns, &tokens[..visible * ps], 0, now, &mut ids);
        tier.tree.lock(m.node).map_err(internal)?;
        let room = tier.free.len() + tier.tree.num_evictable_pages();
        let end = num_pages.min(visible + room);
        let slots = tier.take_slots(end - visible, now, &mut emptied, &mut evicted);
        tier.tree.unlock(m.node).map_err(internal)?;
        record_tier_removed(st, t, &evicted);
        let Some(slots) = slots.filter(|_| end > visible) else {
            for ns in emptied {
                st.forget_if_unused(ns);
            }
            st.forget_if_unused(ns);
            return Ok(0);
        };
        let tier = &mut st.tiers[t];
        ids.truncate(visible);
        ids.extend(slots.iter().map(|&s| s + 1));
        let ins = tier
            .tree
            .insert(ns, &tokens[..end * ps], &ids, 0, now)
            .map_err(internal)?;
        debug_assert_eq!(ins.num_adopted_pages, end - visible);
        for (i, &slot) in slots.iter().enumerate() {
            tier.keys[slot as usize] = keys[visible + i];
        }
        tier.stats.num_marked_pages += slots.len() as u64;
        // The tier's own key of the page before (public when a tenant's pages follow a public prefix).
        let parent = (visible > 0).then(|| tier.keys[(ids[visible - 1] - 1) as usize]);
        let marked = &tokens[visible * ps..end * ps];
        record_tier_stored(st, t, ns, &keys[visible..end], parent, &slots, marked);
        for ns in emptied {
            st.forget_if_unused(ns);
        }
        Ok(slots.len())
    }

    /// Rebuild tier `tier_name`'s index from pages a previous run stored (a reopened disk
    /// directory): each page is accepted only if its key is what this manager computes from its
    /// parent's key (this manager's root key for a first page: same fingerprint only), its
    /// namespace and its tokens, and its slot is free and in range (or the index holds this very
    /// page in that slot already: accepted, and the walk goes on below it). Returns, per page,
    /// whether the index holds it now (a rejected one is foreign, orphaned or a duplicate: the
    /// caller may reuse its slot). Give every entry in one call: a namespace's own copy of public
    /// tokens is restored beside the public copy only when both come in the same call.
    pub fn restore_tier(
        &self,
        tier_name: &str,
        pages: &[RestoredPage],
        now: u64,
    ) -> KvResult<Vec<RestoreOutcome>> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let t = Self::tier_index(st, tier_name, "restore_tier")?;
        let ps = self.page_size;
        let n = st.tiers[t].config.num_slots;
        for (i, p) in pages.iter().enumerate() {
            if p.tokens.len() != ps {
                return Err(KvError::InvalidArgument(format!(
                    "restore_tier: page {i} has {} tokens, the page size is {ps}",
                    p.tokens.len()
                )));
            }
            if p.slot as usize >= n {
                return Err(KvError::InvalidArgument(format!(
                    "restore_tier: page {i} is in slot {}, the tier has {n}",
                    p.slot
                )));
            }
        }
        let mut children: HashMap<PageKey, Vec<usize>> = HashMap::new();
        for (i, p) in pages.iter().enumerate() {
            children.entry(p.parent_key).or_default().push(i);
        }
        // Entries the walk never reaches keep `UnknownParent` or become `ParentRefused` (below).
        let mut outcome = vec![RestoreOutcome::UnknownParent; pages.len()];
        let mut free: HashSet<u32> = st.tiers[t].free.iter().copied().collect();
        // Keys whose children are on the stack already: a key names one chain, so one tier node,
        // and entries with the same key (duplicate files) must not push their children again: with
        // two copies per level that visited 2^depth entries under the manager's lock.
        let mut expanded: HashSet<PageKey> = HashSet::new();
        // Depth-first from the root key: (page index, depth); the path's tokens and slots are
        // kept for the current branch only. Siblings in any order: each page is added among its
        // own namespace's pages (`extend_own`), so a namespace's own copy of public tokens and
        // the public copy are two pages whichever comes first, in one call or two.
        let push = |kids: &[usize], depth: usize, stack: &mut Vec<(usize, usize)>| {
            stack.extend(kids.iter().map(|&i| (i, depth)));
        };
        let mut stack: Vec<(usize, usize)> = Vec::new();
        if let Some(kids) = children.get(&self.root_key) {
            push(kids, 0, &mut stack);
        }
        // The current branch: per depth, the slot id (+1) and namespace of its page, and the tier
        // node ending there. Each page joins the tier below its parent's node (not found again from
        // the root: a namespace's own copy of public tokens and the public copy are two branches).
        let mut path_slots: Vec<PageId> = Vec::new();
        let mut path_ns: Vec<Namespace> = Vec::new();
        let mut path_nodes: Vec<NodeId> = Vec::new();
        while let Some((i, depth)) = stack.pop() {
            let p = &pages[i];
            path_slots.truncate(depth);
            path_ns.truncate(depth);
            path_nodes.truncate(depth);
            let ns = match p.namespace.as_deref() {
                None => crate::radix::DEFAULT_NAMESPACE,
                Some(name) => {
                    let known = st.known_namespace(Some(name));
                    st.resolve_namespace(known, Some(name))
                }
            };
            let kns = st.key_namespace(ns).ok_or_else(|| {
                internal(KvError::InvalidArgument("namespace without a name".into()))
            })?;
            // A path is public pages from the root, then one namespace's (see `crate::radix`): a
            // page may continue its parent's namespace or a public parent, nothing else (a chain
            // that crosses tenants is not one kvcore writes: a foreign or tampered directory).
            let continues = path_ns.last().map_or(true, |&parent| {
                parent == ns || parent == crate::radix::PUBLIC_NAMESPACE
            });
            if !continues || page_key(&p.parent_key, kns, &p.tokens) != p.key {
                outcome[i] = if continues {
                    RestoreOutcome::KeyMismatch
                } else {
                    RestoreOutcome::CrossesNamespace
                };
                st.forget_if_unused(ns);
                continue;
            }
            let below = path_nodes.last().copied().unwrap_or(ROOT);
            // A slot in use is refused, unless the index holds this very page there already (a
            // page a reset could not drop, locked by a load in flight, or one an earlier restore
            // took): the branch then goes on below it, and the entry counts as accepted (its file
            // must be kept). Refusing it cut every page below from the index for good. Found
            // among the entry's own namespace's pages, as `extend_own` finds them: a slot a store
            // in flight took keeps the key of the page it held, and a tenant's entry for that old
            // page would otherwise "find" a public copy of the same tokens, be inserted as a new
            // page (in a slot the store owns) and then refused with the insert left in the tree.
            let held_here = !free.contains(&p.slot)
                && st.tiers[t].keys[p.slot as usize] == p.key
                && st.tiers[t].tree.peek_own_len_from(ns, below, &p.tokens) == Ok(1);
            if !held_here && !free.contains(&p.slot) {
                outcome[i] = RestoreOutcome::SlotInUse;
                st.forget_if_unused(ns);
                continue;
            }
            let tier = &mut st.tiers[t];
            // A refused insert changes nothing: the entry is rejected like any other bad one.
            // Own pages only: the entry's key is chained in `ns`, so a public copy of the same
            // tokens (restored by an earlier call) is another page, not this one.
            let Ok(ins) = tier
                .tree
                .extend_own(ns, below, &p.tokens, &[p.slot + 1], 0, now)
            else {
                outcome[i] = RestoreOutcome::IndexRefused;
                st.forget_if_unused(ns);
                continue;
            };
            let mut kept = Vec::with_capacity(1);
            tier.tree.path_pages(ins.node, 1, &mut kept);
            let Some(&(slot_id, kept_ns)) = kept.first() else {
                outcome[i] = RestoreOutcome::IndexRefused;
                st.forget_if_unused(ns);
                continue;
            };
            if held_here {
                // (extend_own adopted nothing: its own lookup found the page, as `held_here`'s
                // did) the copy found must be this slot's
                if ins.num_adopted_pages != 0 || slot_id != p.slot + 1 || kept_ns != ns {
                    outcome[i] = RestoreOutcome::IndexRefused;
                    st.forget_if_unused(ns);
                    continue;
                }
                // The tier holds this very page there (its file names its key): a slot marked bad
                // by a failed load is good again, as a lookup that finds its key makes it (kept
                // bad, with children, it blocked the prefix for good).
                tier.clear_bad(p.slot);
                outcome[i] = RestoreOutcome::Accepted;
            } else if ins.num_adopted_pages != 1 {
                // A duplicate of a page restored already below the same parent: the branch goes on
                // from the copy the tier kept, if it is in the same namespace (else its children,
                // keyed in this chain, would hang below a page keyed in another).
                outcome[i] = RestoreOutcome::Duplicate;
                if kept_ns != ns {
                    st.forget_if_unused(ns);
                    continue;
                }
            } else {
                free.remove(&p.slot);
                tier.keys[p.slot as usize] = p.key;
                tier.stats.num_restored_pages += 1;
                outcome[i] = RestoreOutcome::Accepted;
                // The tier's own key of the page before (its slot is the path's previous one).
                let parent = (depth > 0).then(|| tier.keys[(path_slots[depth - 1] - 1) as usize]);
                record_tier_stored(st, t, ns, &[p.key], parent, &[p.slot], &p.tokens);
            }
            path_slots.push(slot_id);
            path_ns.push(ns);
            path_nodes.push(ins.node);
            if let Some(kids) = children.get(&p.key) {
                if expanded.insert(p.key) {
                    push(kids, depth + 1, &mut stack);
                }
            }
        }
        let given: HashSet<PageKey> = pages.iter().map(|p| p.key).collect();
        for (o, p) in outcome.iter_mut().zip(pages) {
            if *o == RestoreOutcome::UnknownParent && given.contains(&p.parent_key) {
                *o = RestoreOutcome::ParentRefused;
            }
        }
        let tier = &mut st.tiers[t];
        tier.free.retain(|s| free.contains(s));
        Ok(outcome)
    }

    /// Check the tiers' invariants (slots partitioned, counts exact); for tests.
    pub fn check_tiers(&self) -> Result<(), String> {
        let st = self.state.lock();
        for (t, tier) in st.tiers.iter().enumerate() {
            let in_flight: Vec<u32> = st
                .transfers
                .stores
                .values()
                .filter(|(op, _)| op.tier == t)
                .flat_map(|(op, _)| op.slots.iter().copied())
                .collect();
            tier.check(&in_flight)?;
        }
        st.groups.check_counts()?;
        st.tree.check_invariants()
    }
}

/// Record that `slots` of tier `t` now hold the pages `keys` of `ns` (`parent`: the key before the
/// first; `None` at the root).
fn record_tier_stored(
    st: &mut State,
    t: usize,
    ns: Namespace,
    keys: &[PageKey],
    parent: Option<PageKey>,
    slots: &[u32],
    tokens: &[u32],
) {
    if st.events.is_none() || keys.is_empty() {
        return;
    }
    let namespace = st.namespace_label(ns);
    let medium = st.tiers[t].config.name.clone();
    if let Some(events) = st.events.as_mut() {
        events.push(super::KvEvent::Stored {
            keys: keys.to_vec(),
            parent,
            namespace,
            pages: slots.to_vec(),
            medium,
            tokens: tokens.to_vec(),
        });
    }
}

/// Record that `evicted` slots (with their keys) left tier `t`.
pub(super) fn record_tier_removed(st: &mut State, t: usize, evicted: &[(u32, PageKey)]) {
    if evicted.is_empty() {
        return;
    }
    let medium = st.tiers[t].config.name.clone();
    if let Some(events) = st.events.as_mut() {
        events.push(super::KvEvent::Removed {
            keys: evicted.iter().map(|&(_, k)| k).collect(),
            pages: evicted.iter().map(|&(s, _)| s).collect(),
            medium,
        });
    }
}
