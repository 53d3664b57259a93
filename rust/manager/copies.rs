//! Copy-on-write pairs: queued by `append`, held, cancelled with their destination, taken once per
//! step as one valid `copy_pages` batch.

use super::{internal, KVCacheManager, State};
use crate::error::KvResult;
use crate::PageId;

impl KVCacheManager {
    /// Copies `(src_page, dst_page)` queued by copy-on-write since the last call, to apply before
    /// the next kernel writes the pool. One call's pairs are always one valid batch for
    /// `copy_pages`: destinations are distinct, no destination is a source, and each pair's
    /// source already holds the destination's content (chains are resolved to their original
    /// source), so they may be applied in any order or all at once. Pairs of a sequence freed
    /// (or a page evicted) before this call were cancelled then.
    pub fn take_pending_copies(&self) -> KvResult<Vec<(PageId, PageId)>> {
        let mut guard = self.state.lock();
        let pairs = std::mem::take(&mut guard.pending_copies);
        let sources: Vec<PageId> = pairs.iter().map(|&(src, _)| src).collect();
        // The holds end here; a source freed now can only be written by a later step's kernels.
        self.alloc.free_serialized(&sources).map_err(internal)?;
        for (node, _) in std::mem::take(&mut guard.copy_locks) {
            guard.tree.unlock(node).map_err(internal)?;
        }
        Ok(pairs)
    }

    /// Drop one reference per listed page, then cancel the queued copies whose destination lost
    /// its last owner (before anything can reuse it: the allocator is the manager's, under its lock).
    pub(super) fn release(&self, st: &mut State, pages: &[PageId]) -> KvResult<()> {
        self.alloc.free_serialized(pages).map_err(internal)?;
        if st.pending_copies.is_empty() {
            return Ok(());
        }
        let mut i = 0;
        while i < st.pending_copies.len() {
            let (src, dst) = st.pending_copies[i];
            if self.alloc.ref_count(dst).map_err(internal)? == 0 {
                st.pending_copies.remove(i);
                // Sources are never destinations: releasing this hold cancels nothing else.
                self.alloc.free_serialized(&[src]).map_err(internal)?;
                if !st.pending_copies.iter().any(|&(s, _)| s == src) {
                    // Its last copy is gone: a cached source is evictable again.
                    while let Some(at) = st.copy_locks.iter().position(|&(_, s)| s == src) {
                        let (node, _) = st.copy_locks.swap_remove(at);
                        st.tree.unlock(node).map_err(internal)?;
                    }
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Queue a copy of `src` into the fresh page `dst`. A `src` that is itself the destination
    /// of a queued copy (a fork of a fork, before the copies were taken) still holds garbage: the
    /// copy is made from that copy's source instead, which holds what `src` will. The source is
    /// held until the pair is taken or cancelled, so it is never freed and reused meanwhile; hence
    /// sources are never destinations, and destinations (fresh pages, each held by its sequence
    /// until its pair ends) are distinct.
    ///
    /// Returns the source the copy reads (`src`, or the original source of a chain). A source
    /// that is a cached page must stay locked until the copy is taken (`State::copy_locks`): the
    /// caller, which knows its node, records that lock.
    pub(super) fn queue_copy(&self, st: &mut State, src: PageId, dst: PageId) -> KvResult<PageId> {
        let src = st
            .pending_copies
            .iter()
            .find(|&&(_, d)| d == src)
            .map_or(src, |&(s, _)| s);
        self.alloc.retain_serialized(&[src]).map_err(internal)?;
        st.pending_copies.push((src, dst));
        Ok(src)
    }
}

impl State {
    /// Allocator references held by queued copies on `page` (as their source).
    pub(super) fn copy_holds(&self, page: PageId) -> u32 {
        self.pending_copies
            .iter()
            .filter(|&&(src, _)| src == page)
            .count() as u32
    }
}
