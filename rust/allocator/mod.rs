//! The lock-free page allocator (F2): a fixed pool of pages with per-page reference counts.
//!
//! # Design
//! Free pages live in a few **sharded Treiber stacks** (R. K. Treiber, *Systems Programming: Coping
//! with Parallelism*, IBM RJ 5118, 1986), one per shard, each padded to its own cache line. A thread
//! has a home shard: it pops from and pushes to that shard, so two threads hammering one allocator
//! mostly touch different cache lines, and the only shared words on the hot path are the page's own
//! reference count and link. When the home shard is short, the allocation takes pages from the other
//! shards too (the slow path).
//!
//! Each stack head is one `AtomicU64` holding `(tag << 32) | top_page`. The tag is bumped by every
//! successful push and pop, which makes the head ABA-safe: a compare-and-swap against a head that was
//! popped and pushed back in between fails because the tag moved. (A 32-bit tag wraps after 4·10⁹
//! operations on one shard; an ABA would need a thread to sleep between its load and its CAS for
//! exactly a multiple of that many operations.) Page 0, the null page, is never on a stack, so
//! `top_page == 0` means "empty" and a link of 0 means "end of list".
//!
//! Each page has one link word `(depth << 32) | next`, where `depth` is the length of the stack from
//! this page down. The head's depth is therefore the stack length, read in the same snapshot as the
//! head: this is what makes `allocate(n)` all-or-nothing without a separate counter (no extra atomic
//! read-modify-write on the hot path). A bulk pop walks `n` links from the head and swings the head
//! past them with one CAS; a bulk push links the freed pages privately and publishes them with one
//! CAS.
//!
//! Why not an atomic bitmap: finding `n` free bits costs a scan that grows with the pool and with
//! fragmentation, and an exact free count needs a shared counter that every thread would hit; the
//! stacks give O(n) allocation and an exact per-shard length for free.
//!
//! # Reference counts and validation
//! `ref_cnt[page]` is 0 exactly when the page is free or being freed. `free` checks every id, then
//! drops one reference per listed page; pages that reach zero are linked into a private chain and
//! published only when the whole batch has succeeded. `retain` increments with a CAS that refuses
//! to revive a free page and undoes its increments if a later page fails (safe: an increment we
//! hold back can only delay a page's release, never publish it).
//!
//! Every release is a compare-and-swap on the page's count, the sole owner's (1 -> 0) included, so
//! owners releasing a page at once stay exact and two threads freeing the *same* singly owned page
//! at the *same* instant (a double free racing itself) never both succeed: exactly one takes the
//! count to zero, the other sees 0 and raises `DoubleFree`. A raising call first gives back every
//! count it took, so the counts are as before it. Two racing frees of the same batch claim its
//! pages in the same order, so exactly one of them succeeds; two frees of overlapping batches
//! listed in different orders may both raise (each losing a page to the other), and then every
//! count is as it was and the owner's retry succeeds. The CAS costs a few nanoseconds a page over a
//! plain store (see BENCHMARKS.md); the serialized variants below keep plain stores.
//!
//! Before `free` decrements its first *shared* page it validates the rest of the batch (every page
//! held, no page listed more times than it has references), because undoing a shared page's
//! decrement is unsafe: a co-owner may free the page to zero in between. Decrements of pages only
//! this call held (count 1, not yet published) are safe to undo, so a batch of unshared pages (the
//! common case) is checked and released in one pass. Only a caller race (another thread releasing
//! references this call was given) can make a validated batch fail; it then undoes what it did,
//! best effort.
//!
//! A caller that already serialises every reference-count change (the manager, under its lock) uses
//! `retain_serialized` / `free_serialized`: the same validation and contract, with plain loads and
//! stores on shared pages' counts instead of compare-and-swaps. The stacks stay lock-free, so other
//! threads may still allocate and free *other* pages meanwhile.
//!
//! # Linearizability
//! On one shard, allocate/free are linearizable at the head CAS. Across shards, near exhaustion, two
//! racing allocations that together need more than is free may both fail (each may briefly hold pages
//! it then returns); neither ever takes a page the other holds, and a failed call leaves nothing taken.

use crate::error::{try_boxed_slice, KvError, KvResult};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::{PageId, NULL_PAGE};

/// The largest pool: page ids must fit a non-negative `int32` (the dtype of page tables).
pub const MAX_PAGES: usize = i32::MAX as usize;

/// Most shards an allocator ever uses; more than the cores it runs on buys nothing.
const MAX_SHARDS: usize = 64;

/// Pages per shard below which extra shards stop paying for themselves.
const MIN_PAGES_PER_SHARD: usize = 64;

const LOW: u64 = 0xFFFF_FFFF;

/// One Treiber stack head, alone on a cache line (128 bytes: adjacent-line prefetch on x86).
#[repr(align(128))]
struct Shard {
    /// `(tag << 32) | top_page`; top_page 0 means empty.
    head: AtomicU64,
}

#[inline]
fn pack(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

#[inline]
fn hi(word: u64) -> u32 {
    (word >> 32) as u32
}

#[inline]
fn lo(word: u64) -> u32 {
    (word & LOW) as u32
}

/// A fixed pool of `num_pages` pages (page 0 reserved) with per-page reference counts.
/// Every method takes `&self` and is safe to call from any number of threads at once.
pub struct PageAllocator {
    /// Pages in the pool, the null page included (`1..num_pages` are usable).
    num_pages: u32,
    /// `[num_pages]`: owners of each page; 0 = free (or being freed by a call in flight).
    ref_cnt: Box<[AtomicU32]>,
    /// `[num_pages]`: free-list link `(depth << 32) | next`, meaningful only while the page is free.
    link: Box<[AtomicU64]>,
    /// The stacks of free pages.
    shards: Box<[Shard]>,
    /// `shards.len() - 1` when that is a power of two (picking a shard is then a mask).
    shard_mask: Option<usize>,
}

impl std::fmt::Debug for PageAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageAllocator")
            .field("num_pages", &self.num_pages)
            .field("num_free", &self.num_free())
            .field("num_shards", &self.shards.len())
            .finish()
    }
}

impl PageAllocator {
    /// A pool of `num_pages` pages (page 0 reserved, so `num_pages - 1` usable), sharded for the
    /// machine's parallelism.
    pub fn new(num_pages: usize) -> KvResult<Self> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let by_size = (num_pages / MIN_PAGES_PER_SHARD).max(1);
        let shards = cores.min(by_size).min(MAX_SHARDS);
        // A power of two, so that picking a thread's shard is a mask.
        Self::with_shards(num_pages, 1 << shards.ilog2())
    }

    /// A pool with an explicit number of shards (1 gives a single global stack).
    pub fn with_shards(num_pages: usize, num_shards: usize) -> KvResult<Self> {
        if num_pages == 0 || num_pages > MAX_PAGES {
            return Err(KvError::InvalidArgument(format!(
                "num_pages must be in 1..={MAX_PAGES} (page 0 is the reserved null page), got {num_pages}"
            )));
        }
        if num_shards == 0 || num_shards > MAX_SHARDS {
            return Err(KvError::InvalidArgument(format!(
                "num_shards must be in 1..={MAX_SHARDS}, got {num_shards}"
            )));
        }
        // Fallible: a pool too large for the address space is an error, never an abort.
        let ref_cnt = zeroed_counts(num_pages)?;
        // Shard s starts with a contiguous run of pages, lowest id on top, so a fresh allocator hands
        // out 1, 2, 3, ... from shard 0 and threads on different shards touch different cache lines.
        let usable = num_pages - 1;
        let mut tops = Vec::with_capacity(num_shards);
        let mut ends = Vec::with_capacity(num_shards);
        for s in 0..num_shards {
            let start = 1 + usable * s / num_shards;
            let end = 1 + usable * (s + 1) / num_shards;
            ends.push(end);
            tops.push(if start < end { start as u32 } else { NULL_PAGE });
        }
        let mut shard_of_page = 0;
        let link = try_boxed_slice(num_pages, "free-list links", |page| {
            if page == 0 {
                return AtomicU64::new(0);
            }
            while page >= ends[shard_of_page] {
                shard_of_page += 1;
            }
            let end = ends[shard_of_page];
            let next = if page + 1 < end { page + 1 } else { 0 };
            AtomicU64::new(pack((end - page) as u32, next as u32))
        })?;
        let shards = tops
            .into_iter()
            .map(|top| Shard {
                head: AtomicU64::new(pack(0, top)),
            })
            .collect();
        Ok(Self {
            num_pages: num_pages as u32,
            ref_cnt,
            link,
            shards,
            shard_mask: num_shards.is_power_of_two().then(|| num_shards - 1),
        })
    }

    /// Pages in the pool, the null page included.
    pub fn num_pages(&self) -> usize {
        self.num_pages as usize
    }

    /// Number of shards (free-page stacks).
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Free pages right now: exact when no call is in flight, a consistent per-shard snapshot otherwise.
    pub fn num_free(&self) -> usize {
        self.shards.iter().map(|s| self.stack_len(s) as usize).sum()
    }

    /// References held on `page` (0 when free).
    pub fn ref_count(&self, page: PageId) -> KvResult<u32> {
        self.check_page(page, 0)?;
        // Relaxed: a statistic; callers that need ordering synchronise through their own hand-off.
        Ok(self.ref_cnt[page as usize].load(Ordering::Relaxed))
    }

    /// Allocate `n` pages, each with one reference, or `None` when fewer than `n` are free.
    pub fn allocate(&self, n: usize) -> KvResult<Option<Vec<PageId>>> {
        let mut out = vec![NULL_PAGE; n];
        Ok(self.allocate_into(&mut out)?.then_some(out))
    }

    /// Fill `out` with `out.len()` distinct pages (each with one reference) and return `true`, or
    /// return `false` and take nothing when fewer are free. `out` is unspecified after `false`.
    #[inline]
    pub fn allocate_into(&self, out: &mut [PageId]) -> KvResult<bool> {
        self.allocate_into_from(self.home_shard(), out)
    }

    /// [`allocate_into`](Self::allocate_into) with an explicit home shard (for tests and models).
    #[doc(hidden)]
    #[inline]
    pub fn allocate_into_from(&self, home: usize, out: &mut [PageId]) -> KvResult<bool> {
        let n = out.len();
        if n > self.num_pages as usize - 1 {
            return Err(KvError::InvalidArgument(format!(
                "cannot allocate {n} pages from a pool of {} usable pages",
                self.num_pages - 1
            )));
        }
        if n == 0 {
            return Ok(true);
        }
        let home = self.reduce(home);
        if n == 1 {
            // The scheduler's most frequent request, without the bulk path's loops.
            let shard = &self.shards[home];
            let head = shard.head.load(Ordering::Acquire);
            let top = lo(head);
            if top != NULL_PAGE && top < self.num_pages {
                // A stale `next` (the head moved) is caught by the CAS.
                let next = lo(self.link[top as usize].load(Ordering::Relaxed));
                let popped = pack(hi(head).wrapping_add(1), next);
                if shard
                    .head
                    .compare_exchange(head, popped, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.ref_cnt[top as usize].store(1, Ordering::Relaxed);
                    out[0] = top;
                    return Ok(true);
                }
            }
        }
        if self.pop(&self.shards[home], out, true) != n && !self.allocate_slow(home, out) {
            return Ok(false);
        }
        for &page in out.iter() {
            // Relaxed: the page is ours alone until the caller hands it on (which synchronises).
            self.ref_cnt[page as usize].store(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Take pages from every shard, home first; if the total falls short, give them all back.
    #[cold]
    fn allocate_slow(&self, home: usize, out: &mut [PageId]) -> bool {
        let num_shards = self.shards.len();
        let mut got = 0;
        for i in 0..num_shards {
            got += self.pop(
                &self.shards[(home + i) % num_shards],
                &mut out[got..],
                false,
            );
            if got == out.len() {
                return true;
            }
        }
        if got > 0 {
            self.push_slice(&self.shards[home], &out[..got]);
        }
        false
    }

    /// Drop one reference per listed page (a page listed k times drops k); pages reaching zero return
    /// to the pool. All or nothing: on any error nothing changes.
    #[inline]
    pub fn free(&self, pages: &[PageId]) -> KvResult<()> {
        self.free_from(self.home_shard(), pages)
    }

    /// [`free`](Self::free) with an explicit home shard (for tests and models).
    #[doc(hidden)]
    #[inline]
    pub fn free_from(&self, home: usize, pages: &[PageId]) -> KvResult<()> {
        let shard = &self.shards[self.reduce(home)];
        if let [page] = *pages {
            // One page held once (the common release of a decode page): no chain to build.
            if page != NULL_PAGE && page < self.num_pages {
                // The sole owner's release: a CAS, so that of two racing frees exactly one wins.
                if self.ref_cnt[page as usize]
                    .compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    self.push_chain(shard, page, 1);
                    return Ok(());
                }
            }
        }
        self.free_batch::<false>(shard, pages)
    }

    /// [`free`](Self::free) for a caller that serialises every reference-count change on this
    /// allocator (the manager does, under its lock): a shared page's count drops with a plain load
    /// and store instead of a compare-and-swap (7 to 10 ns a page on the reference machine). The
    /// stacks are still updated lock-free, so other threads may allocate and free other pages
    /// meanwhile. Same validation and all-or-nothing contract as `free`.
    ///
    /// **Contract:** while this runs, no other call may change the counts of the listed pages
    /// (no `free`, `retain` or serialized call on them from another thread). Breaking it is not
    /// undefined behaviour, but counts go wrong silently and a page can be handed out twice.
    pub fn free_serialized(&self, pages: &[PageId]) -> KvResult<()> {
        self.free_batch::<true>(&self.shards[self.home_shard()], pages)
    }

    /// The batch path of `free`; `SERIAL`: see [`free_serialized`](Self::free_serialized).
    fn free_batch<const SERIAL: bool>(&self, shard: &Shard, pages: &[PageId]) -> KvResult<()> {
        // Pages reaching zero are linked privately, each on top of the previous one, with depths
        // computed against the head seen now; if the head is unchanged at publication (the common
        // case) one CAS publishes the chain as built.
        let head = shard.head.load(Ordering::Acquire);
        let base = self.depth_of(lo(head));
        // The common batch: pages this call holds alone, released with a plain store and linked in a
        // tight loop. The first page that is not (out of range, shared, already free) hands over to
        // the general loop below, which continues the chain. `first` is the chain's top: the
        // current head until a page is linked above it.
        let mut first = lo(head);
        let mut len = 0u32;
        for &page in pages {
            if page == NULL_PAGE || page >= self.num_pages {
                break;
            }
            if !self.release_sole::<SERIAL>(&self.ref_cnt[page as usize]) {
                break;
            }
            len += 1;
            self.link[page as usize].store(pack(base.wrapping_add(len), first), Ordering::Relaxed);
            first = page;
        }
        // Until the first shared page, every page decremented had this call's reference only and is
        // unpublished, so an error can still be undone safely; the first shared page triggers a full
        // validation of the rest of the batch before anything shared is touched. A serialized call
        // needs none: nobody else changes these counts, so undoing a shared page's decrement is
        // safe too, and the loop below undoes on the first error (the pages it took to zero are on
        // no stack yet). That saves a pass and a duplicate search on every sequence's release.
        let mut validated = SERIAL;
        for (i, &page) in pages.iter().enumerate().skip(len as usize) {
            if page == NULL_PAGE || page >= self.num_pages {
                debug_assert!(SERIAL || !validated, "validated batches have no bad ids");
                self.undo_free(&pages[..i]);
                return self.check_page(page, i);
            }
            let cnt = &self.ref_cnt[page as usize];
            // Acquire pairs with the Release of other owners' decrements: once the page reaches zero
            // we see every access made under the references released before ours.
            let mut cur = cnt.load(Ordering::Acquire);
            let last_owner = loop {
                if cur == 0 {
                    self.undo_free(&pages[..i]);
                    return Err(KvError::DoubleFree(format!(
                        "page {page} (position {i}) is already free{}",
                        if pages[..i].contains(&page) {
                            " (listed more times than it has references)"
                        } else {
                            ""
                        }
                    )));
                }
                if cur > 1 && !validated {
                    if let Err(err) = self.check_releasable(&pages[i..], i) {
                        self.undo_free(&pages[..i]);
                        return Err(err);
                    }
                    validated = true;
                }
                if SERIAL {
                    // Nobody else changes this count now (the caller's contract).
                    cnt.store(cur - 1, Ordering::Relaxed);
                    break cur == 1;
                }
                // A CAS for the sole owner too: of two racing frees of a page held once, exactly
                // one takes it to zero.
                match cnt.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break cur == 1,
                    Err(now) => cur = now,
                }
            };
            if !last_owner {
                continue;
            }
            // The page is ours alone now (count 0, on no stack).
            // A stale `base` (the head moved) is harmless: the CAS below fails and the chain is redone.
            self.link[page as usize]
                .store(pack(base.wrapping_add(len + 1), first), Ordering::Relaxed);
            first = page;
            len += 1;
        }
        if len > 0 {
            let new_head = pack(hi(head).wrapping_add(1), first);
            // Release publishes the links just written to the next pop's Acquire.
            if shard
                .head
                .compare_exchange(head, new_head, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                self.push_chain(shard, first, len);
            }
        }
        Ok(())
    }

    /// Release a page held once (count 1 -> 0): `false`, nothing changed, if its count is not 1.
    /// A compare-and-swap unless `SERIAL` (the caller serialises count changes), so that two racing
    /// frees of one page never both succeed.
    #[inline]
    fn release_sole<const SERIAL: bool>(&self, cnt: &AtomicU32) -> bool {
        if SERIAL {
            // Acquire: as in the general loop of `free_batch`.
            if cnt.load(Ordering::Acquire) != 1 {
                return false;
            }
            cnt.store(0, Ordering::Relaxed);
            return true;
        }
        cnt.compare_exchange(1, 0, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Validate the rest of a `free` batch (`pages`, starting at position `offset` of the call)
    /// before anything shared is decremented: every id in range, every listed page held, and no page
    /// listed more times than it has references. Undoing a decrement of a shared page would not be
    /// safe: a co-owner may take it to zero (and publish it) before the undo.
    fn check_releasable(&self, pages: &[PageId], offset: usize) -> KvResult<()> {
        let mut shared = false;
        for (i, &p) in pages.iter().enumerate() {
            if p == NULL_PAGE || p >= self.num_pages {
                return self.check_page(p, offset + i);
            }
            // Acquire: pairs with other owners' releases, like the decrement that follows.
            let held = self.ref_cnt[p as usize].load(Ordering::Acquire);
            if held == 0 {
                let i = offset + i;
                return Err(KvError::DoubleFree(format!(
                    "page {p} (position {i}) is already free"
                )));
            }
            shared |= held > 1;
        }
        if !shared {
            return Ok(());
        }
        if !has_duplicates(pages, self.num_pages as usize) {
            return Ok(());
        }
        // Rare: the batch lists a page more than once. Count exactly.
        let mut listed: std::collections::HashMap<PageId, u32> = std::collections::HashMap::new();
        for &p in pages {
            *listed.entry(p).or_default() += 1;
        }
        for (i, &p) in pages.iter().enumerate() {
            let held = self.ref_cnt[p as usize].load(Ordering::Acquire);
            if listed[&p] > held {
                return Err(KvError::DoubleFree(format!(
                    "page {p} (position {}) is listed {} times but has {held} references \
                     (listed more times than it has references)",
                    offset + i,
                    listed[&p]
                )));
            }
        }
        Ok(())
    }

    /// Give back the references a failed `free` dropped. Reached for a batch of unshared pages that
    /// lists one twice (safe: every page decremented had this call's reference only, and none is
    /// published yet), when a racing free of the same pages took one first (a double free racing
    /// itself), or when another thread released references this call was given (a race in the
    /// caller: best effort, see `check_releasable`).
    ///
    /// Release: this call already wrote the link of each page it took to zero; a racing free that
    /// then takes the restored count (with Acquire) must see that write before it writes its own
    /// link, or ours could land last and corrupt its chain (found by the loom model
    /// `crossing_double_frees_never_both_succeed_nor_leak`).
    fn undo_free(&self, pages: &[PageId]) {
        for &page in pages {
            self.ref_cnt[page as usize].fetch_add(1, Ordering::Release);
        }
    }

    /// Add one reference per listed page (sharing). All or nothing: on any error nothing changes.
    pub fn retain(&self, pages: &[PageId]) -> KvResult<()> {
        self.check_pages(pages)?;
        for (i, &page) in pages.iter().enumerate() {
            let cnt = &self.ref_cnt[page as usize];
            let mut cur = cnt.load(Ordering::Relaxed);
            loop {
                let err = if cur == 0 {
                    Some(KvError::DoubleFree(format!(
                        "cannot retain page {page} (position {i}): it is free"
                    )))
                } else if cur == u32::MAX {
                    Some(KvError::InvalidArgument(format!(
                        "page {page} already has {cur} references"
                    )))
                } else {
                    None
                };
                if let Some(err) = err {
                    for &done in &pages[..i] {
                        self.ref_cnt[done as usize].fetch_sub(1, Ordering::Relaxed);
                    }
                    return Err(err);
                }
                // Relaxed: taking a reference from a held one publishes nothing new.
                match cnt.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(now) => cur = now,
                }
            }
        }
        Ok(())
    }

    /// [`retain`](Self::retain) for a caller that serialises every reference-count change on this
    /// allocator (see [`free_serialized`](Self::free_serialized)): the ids are checked first, then
    /// each count rises with a plain load and store; a free page further on undoes the increments
    /// already made (safe, as nobody else changes these counts). All or nothing. Same contract as
    /// `free_serialized`.
    pub fn retain_serialized(&self, pages: &[PageId]) -> KvResult<()> {
        self.check_pages(pages)?;
        for (i, &page) in pages.iter().enumerate() {
            let cnt = &self.ref_cnt[page as usize];
            match cnt.load(Ordering::Relaxed) {
                0 => {
                    self.undo_retain_serialized(&pages[..i]);
                    return Err(KvError::DoubleFree(format!(
                        "cannot retain page {page} (position {i}): it is free"
                    )));
                }
                u32::MAX => {
                    self.undo_retain_serialized(&pages[..i]);
                    return Err(KvError::InvalidArgument(format!(
                        "page {page} already has {} references",
                        u32::MAX
                    )));
                }
                cur => cnt.store(cur + 1, Ordering::Relaxed),
            }
        }
        Ok(())
    }

    fn undo_retain_serialized(&self, pages: &[PageId]) {
        for &page in pages {
            let cnt = &self.ref_cnt[page as usize];
            cnt.store(cnt.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        }
    }

    fn check_page(&self, page: PageId, position: usize) -> KvResult<()> {
        if page == NULL_PAGE || page >= self.num_pages {
            let shown = page as i32; // ids come from int32 arrays: show -1, not 4294967295
            let why = if page == NULL_PAGE {
                "is the reserved null page"
            } else {
                "is out of range"
            };
            return Err(KvError::InvalidPage(format!(
                "page {shown} (position {position}) {why}; valid pages are 1..={}",
                self.num_pages - 1
            )));
        }
        Ok(())
    }

    fn check_pages(&self, pages: &[PageId]) -> KvResult<()> {
        // One branch per page on the happy path; the position is found only when reporting.
        if pages.iter().all(|&p| p != NULL_PAGE && p < self.num_pages) {
            return Ok(());
        }
        let (i, &page) = pages
            .iter()
            .enumerate()
            .find(|(_, &p)| p == NULL_PAGE || p >= self.num_pages)
            .unwrap_or((0, &0));
        self.check_page(page, i)
    }

    /// The depth stored in `top`'s link (0 for the empty stack); meaningful when `top` is a head.
    #[inline]
    fn depth_of(&self, top: PageId) -> u32 {
        if top == NULL_PAGE {
            0
        } else {
            hi(self.link[top as usize].load(Ordering::Relaxed))
        }
    }

    /// The length of one stack, read consistently with its head.
    fn stack_len(&self, shard: &Shard) -> u32 {
        loop {
            let head = shard.head.load(Ordering::Acquire);
            let top = lo(head);
            if top == NULL_PAGE {
                return 0;
            }
            let depth = hi(self.link[top as usize].load(Ordering::Relaxed));
            // The top's link only changes after it is popped, which moves the tag: an unchanged head
            // proves the depth belongs to it.
            if shard.head.load(Ordering::Acquire) == head {
                return depth;
            }
        }
    }

    /// Pop `out.len()` pages (if `exact`, all or none) or as many as there are (if not) from one stack.
    /// Returns the number popped; their counts are still 0.
    fn pop(&self, shard: &Shard, out: &mut [PageId], exact: bool) -> usize {
        'retry: loop {
            // Acquire pairs with the Release of the push that installed this head: the links of
            // every page below it are visible.
            let head = shard.head.load(Ordering::Acquire);
            let top = lo(head);
            if top == NULL_PAGE {
                return 0;
            }
            let depth = hi(self.link[top as usize].load(Ordering::Relaxed)) as usize;
            let want = if depth >= out.len() {
                out.len()
            } else if exact || depth == 0 {
                if shard.head.load(Ordering::Acquire) != head {
                    continue 'retry; // a stale depth: look again
                }
                return 0;
            } else {
                depth
            };
            let mut page = top;
            for slot in out[..want].iter_mut() {
                if page == NULL_PAGE || page >= self.num_pages {
                    continue 'retry; // links read while the stack changed; the CAS would fail anyway
                }
                *slot = page;
                page = lo(self.link[page as usize].load(Ordering::Relaxed));
            }
            let new_head = pack(hi(head).wrapping_add(1), page);
            if shard
                .head
                .compare_exchange_weak(head, new_head, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return want;
            }
        }
    }

    /// Publish a private chain of `len` pages starting at `first` (its bottom link is rewritten) on a stack, with one CAS.
    #[inline]
    fn push_chain(&self, shard: &Shard, first: PageId, len: u32) {
        let mut head = shard.head.load(Ordering::Acquire);
        loop {
            let top = lo(head);
            let base = self.depth_of(top);
            // Depths are relative to the stack we land on, so they are rewritten on every attempt.
            let mut page = first;
            for k in 0..len {
                let next = if k + 1 == len {
                    top
                } else {
                    lo(self.link[page as usize].load(Ordering::Relaxed))
                };
                self.link[page as usize]
                    .store(pack(base.wrapping_add(len - k), next), Ordering::Relaxed);
                page = next;
            }
            debug_assert!(len == 0 || page == top);
            // Release publishes the links just written to the next pop's Acquire.
            match shard.head.compare_exchange_weak(
                head,
                pack(hi(head).wrapping_add(1), first),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Push pages that were popped but never handed out (their counts are still 0).
    fn push_slice(&self, shard: &Shard, pages: &[PageId]) {
        for pair in pages.windows(2) {
            self.link[pair[0] as usize].store(pack(0, pair[1]), Ordering::Relaxed);
        }
        if let Some(&first) = pages.first() {
            self.push_chain(shard, first, pages.len() as u32);
        }
    }

    /// `index` modulo the shard count; a mask when it is a power of two (as `new` makes it), since a
    /// division would cost more than the rest of a one-page allocation.
    #[inline]
    fn reduce(&self, index: usize) -> usize {
        match self.shard_mask {
            Some(mask) => index & mask,
            None => index % self.shards.len(),
        }
    }

    /// The calling thread's home shard.
    #[cfg(not(loom))]
    #[inline]
    fn home_shard(&self) -> usize {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
        static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        let index = THREAD_INDEX.with(|cell| {
            let mut index = cell.get();
            if index == usize::MAX {
                // Relaxed: only uniqueness matters, not ordering.
                index = NEXT_THREAD.fetch_add(1, StdOrdering::Relaxed);
                cell.set(index);
            }
            index
        });
        self.reduce(index)
    }

    /// Under loom, models pick shards explicitly through the `*_from` methods; the default is 0.
    #[cfg(loom)]
    fn home_shard(&self) -> usize {
        0
    }
}

/// `n` reference counts at 0, or `OutOfMemory`. Zeroed memory straight from the system allocator:
/// the pages of a huge pool are not touched until used, so building one costs no resident memory
/// for its counts.
#[cfg(not(loom))]
fn zeroed_counts(n: usize) -> KvResult<Box<[AtomicU32]>> {
    let oom = || {
        KvError::OutOfMemory(format!(
            "cannot allocate page reference counts: {n} elements of 4 bytes"
        ))
    };
    let layout = std::alloc::Layout::array::<AtomicU32>(n).map_err(|_| oom())?;
    if layout.size() == 0 {
        return Ok(Box::new([]));
    }
    // SAFETY: `layout` has a non-zero size. All-zero bytes are a valid AtomicU32 (0); the pointer
    // comes from the global allocator with this exact layout, as `Box<[AtomicU32]>` frees it.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<AtomicU32>();
        if ptr.is_null() {
            return Err(oom());
        }
        Ok(Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)))
    }
}

/// Under loom the atomics are loom's (not plain zeroable memory): built one by one.
#[cfg(loom)]
fn zeroed_counts(n: usize) -> KvResult<Box<[AtomicU32]>> {
    try_boxed_slice(n, "page reference counts", |_| AtomicU32::new(0))
}

/// Whether `pages` lists some page twice. Small batches compare pairwise; larger ones mark a
/// per-thread bitmap (one bit per page id, cleared again before returning).
fn has_duplicates(pages: &[PageId], num_pages: usize) -> bool {
    if pages.len() <= 16 || cfg!(loom) {
        return pages
            .iter()
            .enumerate()
            .any(|(i, p)| pages[i + 1..].contains(p));
    }
    #[cfg(not(loom))]
    {
        use std::cell::RefCell;
        thread_local! {
            static SEEN: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
        }
        SEEN.with(|seen| {
            let mut seen = seen.borrow_mut();
            let words = num_pages.div_ceil(64);
            let missing = words.saturating_sub(seen.len());
            if missing > 0 && seen.try_reserve_exact(missing).is_err() {
                // No memory for the bitmap (a huge pool): compare a sorted copy instead.
                let mut sorted = pages.to_vec();
                sorted.sort_unstable();
                return sorted.windows(2).any(|w| w[0] == w[1]);
            }
            if seen.len() < words {
                seen.resize(words, 0);
            }
            let mut dup = false;
            for &p in pages {
                let (word, bit) = ((p >> 6) as usize, 1u64 << (p & 63));
                dup |= seen[word] & bit != 0;
                seen[word] |= bit;
            }
            for &p in pages {
                seen[(p >> 6) as usize] = 0;
            }
            dup
        })
    }
    #[cfg(loom)]
    {
        let _ = num_pages;
        unreachable!()
    }
}
