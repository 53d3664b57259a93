//! The prefix cache as an engine drives it directly (SGLang's `match_prefix` / `insert`): look a
//! prefix up without side effects, take pages from the pool to load K/V computed elsewhere (another
//! tier, another instance), hand them to the tree, and reset the whole cache.
//!
//! Pages taken with [`KVCacheManager::allocate_pages`] are *caller-held*: the manager counts each
//! such reference, so [`KVCacheManager::insert`] accepts only pages the caller holds (never a live
//! sequence's, whose positions the tree could not reconcile) and
//! [`KVCacheManager::free_pages`] refuses to drop a reference the caller does not hold. An adopted
//! page's reference passes to the tree, so no cached page has a holder the tree does not know of:
//! what it counts as evictable is exactly what eviction returns to the pool.

use std::collections::HashSet;

use super::{KVCacheManager, State, UNSEEN_NAMESPACE};
use crate::error::{KvError, KvResult};
use crate::PageId;

/// The longest cached prefix of a token sequence, found by [`KVCacheManager::match_prefix`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Tokens matched (whole pages).
    pub num_tokens: usize,
    /// Their pages, in token order.
    pub pages: Vec<PageId>,
}

impl KVCacheManager {
    /// The longest cached prefix of `tokens` visible from `namespace` (its own pages and the
    /// public ones), in whole pages, and those pages. No side effects: recency, hit counts and
    /// pins are untouched, and nothing is locked (the pages may be evicted by the next call that
    /// needs room; admit a sequence, or pin, to keep them).
    pub fn match_prefix(&self, tokens: &[u32], namespace: Option<&str>) -> PrefixMatch {
        let guard = self.state.lock();
        let ns = guard.known_namespace(namespace).unwrap_or(UNSEEN_NAMESPACE);
        let mut pages = Vec::new();
        let mut n = guard.tree.peek_prefix_pages(ns, tokens, &mut pages);
        if guard.groups.active() {
            // The hit every group allows; the pages are the primary group's. A windowed primary's
            // live in its group cache, which may no longer hold the pages a hit does not need
            // (before its window): those are the null page.
            let (hit, keys, _, _) = self.peek_group_hit(&guard, ns, tokens);
            n = hit;
            if guard.groups.primary_windowed() {
                pages.clear();
                pages.extend(keys[..n].iter().map(|k| guard.groups.page_of(0, k)));
            }
            pages.truncate(n);
        }
        PrefixMatch {
            num_tokens: n * self.page_size,
            pages,
        }
    }

    /// `n` fresh pages held by the caller (one reference each), evicting cached pages if the pool
    /// is short; `None` (nothing changed) if even evicting everything evictable is not enough.
    /// The caller loads K/V into them and hands them to [`insert`](Self::insert), then releases
    /// its references with [`free_pages`](Self::free_pages).
    pub fn allocate_pages(&self, n: usize, now: u64) -> KvResult<Option<Vec<PageId>>> {
        if n > self.alloc.num_pages() - 1 {
            return Err(KvError::InvalidArgument(format!(
                "cannot allocate {n} pages from a pool of {} usable pages",
                self.alloc.num_pages() - 1
            )));
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut pages = Vec::with_capacity(n);
        if !self.allocate(st, n, now, &mut pages) {
            st.stats.num_refused += 1;
            return Ok(None);
        }
        st.caller_held.extend(pages.iter().copied());
        Ok(Some(pages))
    }

    /// Drop the caller's reference on each listed page (from
    /// [`allocate_pages`](Self::allocate_pages)); a page the tree adopted stays cached. All or
    /// nothing: `InvalidPage` for a page the caller does not hold, or lists twice.
    pub fn free_pages(&self, pages: &[PageId]) -> KvResult<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        check_caller_held(st, pages, "free_pages")?;
        for p in pages {
            st.caller_held.remove(p);
        }
        self.release(st, pages)
    }

    /// Cache `tokens` (`[pages.len() * page_size]`) with their K/V in `pages` (caller-held, from
    /// [`allocate_pages`](Self::allocate_pages)) under `namespace`. Where the prefix is already
    /// cached the tree keeps its own pages and the caller's are left to the caller; the rest are
    /// adopted: the tree takes over the caller's reference on each (the caller no longer holds
    /// them, and they are evictable like any cached page). Returns `n`, the number adopted: always
    /// the last `n` pages, so the caller frees `pages[..len - n]` with
    /// [`free_pages`](Self::free_pages). Errors, nothing changed: `InvalidArgument` for mismatched
    /// lengths, `InvalidPage` for a page the caller does not hold or lists twice.
    pub fn insert(
        &self,
        tokens: &[u32],
        pages: &[PageId],
        namespace: Option<&str>,
        now: u64,
    ) -> KvResult<usize> {
        if Some(tokens.len()) != pages.len().checked_mul(self.page_size) {
            return Err(KvError::InvalidArgument(format!(
                "insert: {} tokens for {} pages of {} tokens",
                tokens.len(),
                pages.len(),
                self.page_size
            )));
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if st.groups.active() {
            return Err(KvError::InvalidArgument(
                "insert: a manager with sliding-window or several KV-cache groups takes pages \
                 computed elsewhere only through admission (not supported yet)"
                    .into(),
            ));
        }
        check_caller_held(st, pages, "insert")?;
        if pages.is_empty() {
            return Ok(0);
        }
        let known = st.known_namespace(namespace);
        let ns = st.resolve_namespace(known, namespace);
        let inserted = st.tree.insert(ns, tokens, pages, 0, now);
        let ins = match inserted {
            Ok(ins) => ins,
            Err(err) => {
                st.forget_if_unused(ns);
                return Err(err);
            }
        };
        let adopted_tokens = &tokens[(pages.len() - ins.num_adopted_pages) * self.page_size..];
        self.record_stored(st, ins.node, ins.num_adopted_pages, adopted_tokens, ns)?;
        // The caller's references on the adopted pages become the tree's.
        for p in &pages[ins.adopted()] {
            st.caller_held.remove(p);
        }
        // Pages computed elsewhere are cached pages like any: offered to the lower tiers.
        let trigger = super::tiers::Trigger::Cached {
            priority: 0,
            fresh: pages.len() - ins.num_adopted_pages,
        };
        if ins.num_adopted_pages > 0
            && st.store_policy.may_store(trigger)
            && self.tiers_lack(st, ns, tokens, pages.len())
        {
            let mut keys = Vec::with_capacity(pages.len());
            let public = st.tree.public_pages(ins.node);
            self.extend_keys(st, ns, tokens, pages.len(), &mut keys, public)?;
            let path = (ns, ins.node);
            self.offer_stores(st, path, tokens, (&keys, public), pages.len(), trigger, now)?;
        }
        st.forget_if_unused(ns);
        Ok(ins.num_adopted_pages)
    }

    /// Drop every cached page no live sequence uses, pins included (after a weight update every
    /// cached K/V is wrong). Returns the pages dropped. Pages of live sequences stay cached: free
    /// or finish the sequences first for a complete reset (vLLM refuses to reset while requests
    /// run).
    pub fn reset_prefix_cache(&self, now: u64) -> KvResult<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.tree.clear_pins();
        st.groups.expire_pins(u64::MAX);
        let dropped = self.evict_locked(st, usize::MAX, now)?;
        // The lower tiers' copies go too (weights changed, or a cache declared stale), except
        // those a transfer in flight still holds.
        let mut emptied = Vec::new();
        for t in 0..st.tiers.len() {
            let mut evicted = Vec::new();
            st.tiers[t].clear(now, &mut emptied, &mut evicted);
            super::tiers::record_tier_removed(st, t, &evicted);
        }
        for ns in emptied {
            st.forget_if_unused(ns);
        }
        self.record_cleared(st);
        Ok(dropped)
    }

    /// Pages the caller holds (from [`allocate_pages`](Self::allocate_pages)), one reference
    /// each (a page is allocated once until freed).
    pub fn caller_held_pages(&self) -> Vec<PageId> {
        let mut pages: Vec<PageId> = self.state.lock().caller_held.iter().copied().collect();
        pages.sort_unstable();
        pages
    }
}

/// Every listed page must be held by the caller, and listed once: the caller holds one reference
/// per page (a page is allocated once until freed).
fn check_caller_held(st: &State, pages: &[PageId], op: &str) -> KvResult<()> {
    let mut seen = HashSet::with_capacity(pages.len());
    for (i, &p) in pages.iter().enumerate() {
        let why = if !st.caller_held.contains(&p) {
            "is not held by the caller (pages come from allocate_pages)"
        } else if !seen.insert(p) {
            "is listed twice"
        } else {
            continue;
        };
        return Err(KvError::InvalidPage(format!(
            "{op}: page {} (position {i}) {why}",
            p as i32
        )));
    }
    Ok(())
}
