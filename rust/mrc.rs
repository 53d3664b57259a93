//! Online miss-ratio curves: the prefix hit rate an LRU cache of any size would have had on the
//! requests seen so far ("what would twice the HBM buy?"), from one pass over them.
//!
//! # Why page accesses give the token hit-rate curve
//! An admission touches its prompt's full pages deepest first, so along any cached chain the last
//! use of a page is no later than its parent's, and so a page's LRU *stack distance* (the distinct
//! pages used since its last use) never decreases down a chain. An LRU cache of `c` pages holds
//! exactly the pages of stack distance `< c`: a prefix-closed set, so a prompt's hit at size `c`
//! is its leading pages of distance `< c`, and the token hit rate at `c` is the share of looked-up
//! pages with distance `< c`, times the share of prompt tokens that sit in full pages (research
//! notes, `tiers.md` §6). Pages that fill while decoding are used (at the top of the stack) but
//! not looked up, and a sequence's whole path is used again, deepest first, when it ends: the
//! tree stamps a path as it unlocks it, so ancestors stay at least as recent as their children.
//!
//! # SHARDS, fixed size
//! Waldspurger et al. (FAST'15): only pages whose key hashes below a threshold `T` are tracked
//! (rate `R = T / 2^64`), and a tracked page's distance counts the tracked pages used since, scaled
//! by `1 / R`. The number of tracked pages is bounded (`max_samples`): past it, the page with the
//! largest hash is dropped and `T` falls to it, so memory is fixed and a small workload is exact
//! (`R = 1` until it outgrows the bound). Each sampled lookup adds `1 / R` (at its time) to the
//! histogram of its distance; the hit share is normalised by the histogram's total.
//!
//! A tracked page's last use is a slot in a time-ordered array, with a Fenwick tree over the
//! occupied slots: its distance is the number of occupied slots after its own, O(log n). Slots
//! are renumbered in order when the array is full (every `3 * max_samples` uses at least).
//!
//! The curve is that of an LRU cache holding pages alone: the live sequences' own pages, TTL pins,
//! priorities, quotas and window groups make the real cache differ from it (the replay measures
//! how much, `tests/python/test_mrc.py`).

use std::collections::{BinaryHeap, HashMap};

use crate::radix::FxBuildHasher;

/// Distances below this are their own bucket; above, each power of two has `SUB` buckets.
const EXACT: u64 = 64;
/// Buckets per power of two above [`EXACT`] (about 3 % wide).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets for every `u64` distance.
const NUM_BUCKETS: usize = EXACT as usize + (64 - 6) * SUB as usize;

/// The histogram bucket of distance `d`.
fn bucket(d: u64) -> usize {
    if d < EXACT {
        return d as usize;
    }
    let e = 63 - d.leading_zeros(); // >= 6
    let sub = (d >> (e - SUB_BITS)) & (SUB - 1);
    EXACT as usize + (e as usize - 6) * SUB as usize + sub as usize
}

/// `[low, low + width)`: the distances bucket `b` holds.
fn bucket_range(b: usize) -> (u64, u64) {
    if (b as u64) < EXACT {
        return (b as u64, 1);
    }
    let i = b - EXACT as usize;
    let e = (i / SUB as usize) as u32 + 6;
    let sub = (i % SUB as usize) as u64;
    ((SUB + sub) << (e - SUB_BITS), 1 << (e - SUB_BITS))
}

/// Mixes a chain value into a well-spread 64-bit key (murmur3's finalizer).
#[inline]
pub(crate) fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A fixed-size SHARDS estimator of the prefix hit-rate curve.
#[derive(Clone, Debug)]
pub struct MissRatioCurve {
    max_samples: usize,
    /// A key is tracked iff `key <= threshold`.
    threshold: u64,
    /// Tracked key -> its slot (time of last use).
    last: HashMap<u64, u32, FxBuildHasher>,
    /// The tracked keys, largest first (the next to drop).
    heap: BinaryHeap<u64>,
    /// Fenwick tree (1-based) counting occupied slots.
    fenwick: Vec<u32>,
    /// The key in each slot (meaningful where `occupied`).
    slot_key: Vec<u64>,
    occupied: Vec<bool>,
    /// The next slot to use.
    next: usize,
    /// Estimated lookups per distance bucket (`1 / R` each).
    hist: Vec<f64>,
    /// Estimated lookups of pages never used before (infinite distance).
    cold: f64,
    /// Full pages looked up, exactly.
    lookup_pages: u64,
    /// Prompt tokens looked up (full pages and tails), exactly.
    prompt_tokens: u64,
    page_size: usize,
}

impl MissRatioCurve {
    /// An empty curve tracking at most `max_samples` pages (>= 1) of `page_size` tokens.
    pub fn new(max_samples: usize, page_size: usize) -> Self {
        let max_samples = max_samples.max(1);
        let cap = 4 * max_samples + 4;
        Self {
            max_samples,
            threshold: u64::MAX,
            last: HashMap::default(),
            heap: BinaryHeap::new(),
            fenwick: vec![0; cap + 1],
            slot_key: vec![0; cap],
            occupied: vec![false; cap],
            next: 0,
            hist: vec![0.0; NUM_BUCKETS],
            cold: 0.0,
            lookup_pages: 0,
            prompt_tokens: 0,
            page_size,
        }
    }

    /// The sampling rate now (1.0 while every page used is tracked).
    pub fn sample_rate(&self) -> f64 {
        if self.threshold == u64::MAX {
            1.0
        } else {
            (self.threshold as f64 + 1.0) / 18_446_744_073_709_551_616.0
        }
    }

    /// Pages tracked now (<= `max_samples`).
    pub fn num_samples(&self) -> usize {
        self.last.len()
    }

    /// The bound on tracked pages.
    pub fn max_samples(&self) -> usize {
        self.max_samples
    }

    /// Full pages looked up so far.
    pub fn lookup_pages(&self) -> u64 {
        self.lookup_pages
    }

    /// Prompt tokens looked up so far.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// Forget everything seen (the bound stays).
    pub fn reset(&mut self) {
        *self = Self::new(self.max_samples, self.page_size);
    }

    /// An admission looked up `tokens` prompt tokens whose full pages have keys `keys` (root
    /// first). Each page's distance is taken before the admission uses any of them (the pages
    /// used since its previous use), then the first `used` of them are used deepest first: a
    /// parent is always at least as recent as its children.
    pub fn record_lookup(&mut self, tokens: usize, keys: &[u64], used: usize) {
        self.prompt_tokens += tokens as u64;
        self.lookup_pages += keys.len() as u64;
        let weight = 1.0 / self.sample_rate();
        for &k in keys {
            if k > self.threshold {
                continue;
            }
            match self.last.get(&k) {
                Some(&slot) => {
                    // Tracked pages used since: occupied slots after its own.
                    let after = self.last.len() as u64 - self.prefix(slot as usize);
                    let d = (after as f64 * weight).min(u64::MAX as f64) as u64;
                    self.hist[bucket(d)] += weight;
                }
                None => self.cold += weight,
            }
        }
        for &k in keys[..used.min(keys.len())].iter().rev() {
            self.touch(k);
        }
    }

    /// Pages filled after the lookup (decode, the prompt's last page) are used, root first.
    pub fn record_filled(&mut self, keys: &[u64]) {
        for &k in keys {
            self.touch(k);
        }
    }

    /// A sequence's path (its pages' keys, root first) is released: used again deepest first, as
    /// the tree stamps a path it unlocks (its pages were not evictable while it lived).
    pub fn record_release(&mut self, keys: impl DoubleEndedIterator<Item = u64>) {
        for k in keys.rev() {
            self.touch(k);
        }
    }

    /// Whether `key` is tracked now: the keys a caller must keep for [`record_release`]
    /// (the threshold only falls, so a key not tracked now never will be).
    ///
    /// [`record_release`]: Self::record_release
    #[inline]
    pub fn samples(&self, key: u64) -> bool {
        key <= self.threshold
    }

    /// `key` is the most recently used page now.
    #[inline]
    fn touch(&mut self, key: u64) {
        if key > self.threshold {
            return;
        }
        match self.last.get(&key).copied() {
            Some(slot) => self.clear(slot as usize),
            None => self.heap.push(key),
        }
        if self.next == self.slot_key.len() {
            self.compact();
        }
        let slot = self.next;
        self.next += 1;
        self.slot_key[slot] = key;
        self.occupied[slot] = true;
        self.add(slot, 1);
        self.last.insert(key, slot as u32);
        while self.last.len() > self.max_samples {
            self.drop_largest();
        }
    }

    /// Stop tracking the largest key; only smaller keys are sampled from now on.
    fn drop_largest(&mut self) {
        let Some(k) = self.heap.pop() else { return };
        if let Some(slot) = self.last.remove(&k) {
            self.clear(slot as usize);
        }
        self.threshold = k.saturating_sub(1);
    }

    fn clear(&mut self, slot: usize) {
        debug_assert!(self.occupied[slot]);
        self.occupied[slot] = false;
        self.add(slot, u32::MAX); // -1, wrapping
    }

    /// Renumber the occupied slots `0..n` in time order and rebuild the Fenwick tree.
    fn compact(&mut self) {
        let mut n = 0;
        for s in 0..self.next {
            if self.occupied[s] {
                let key = self.slot_key[s];
                self.slot_key[n] = key;
                self.last.insert(key, n as u32);
                n += 1;
            }
        }
        self.occupied.fill(false);
        self.occupied[..n].fill(true);
        self.next = n;
        // O(cap) build: each node adds itself to its parent.
        self.fenwick.fill(0);
        for i in 1..=n {
            self.fenwick[i] += 1;
        }
        for i in 1..self.fenwick.len() {
            let j = i + (i & i.wrapping_neg());
            if j < self.fenwick.len() {
                self.fenwick[j] = self.fenwick[j].wrapping_add(self.fenwick[i]);
            }
        }
    }

    fn add(&mut self, slot: usize, delta: u32) {
        let mut i = slot + 1;
        while i < self.fenwick.len() {
            self.fenwick[i] = self.fenwick[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Occupied slots in `0..=slot`.
    fn prefix(&self, slot: usize) -> u64 {
        let mut i = slot + 1;
        let mut s: u32 = 0;
        while i > 0 {
            s = s.wrapping_add(self.fenwick[i]);
            i &= i - 1;
        }
        u64::from(s)
    }

    /// The prompt-token hit rate an LRU cache of `size` pages would have had, for each size
    /// (any order): one pass over the histogram.
    pub fn hit_rates(&self, sizes: &[u64]) -> Vec<f64> {
        let sampled: f64 = self.cold + self.hist.iter().sum::<f64>();
        if self.prompt_tokens == 0 || self.lookup_pages == 0 {
            return vec![0.0; sizes.len()];
        }
        // SHARDS_adj: the sampled lookups estimate every lookup; what they miss or add over the
        // exact count is put at distance 0 (the hottest pages, whose few keys decide whether
        // the sample is short or long of them).
        let total = self.lookup_pages as f64;
        let adjust = total - sampled;
        let full = (self.lookup_pages * self.page_size as u64) as f64 / self.prompt_tokens as f64;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_unstable_by_key(|&i| sizes[i]);
        let mut out = vec![0.0; sizes.len()];
        // Weight of the buckets wholly below the current size.
        let (mut below, mut b) = (0.0, 0);
        for i in order {
            let size = sizes[i];
            while b < NUM_BUCKETS {
                let (low, width) = bucket_range(b);
                if low + width > size {
                    break;
                }
                below += self.hist[b];
                b += 1;
            }
            // Distances in the bucket holding `size` spread evenly: those < size hit.
            let mut hit = below + if size > 0 { adjust } else { 0.0 };
            if b < NUM_BUCKETS {
                let (low, width) = bucket_range(b);
                if size > low {
                    hit += self.hist[b] * (size - low) as f64 / width as f64;
                }
            }
            out[i] = (hit / total).clamp(0.0, 1.0) * full;
        }
        out
    }

    /// The largest distance seen, in pages (0: none): past it the curve is flat.
    pub fn max_distance(&self) -> u64 {
        self.hist.iter().rposition(|&w| w > 0.0).map_or(0, |b| {
            let (low, width) = bucket_range(b);
            low + width
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact LRU stack distances by brute force: hit rate at each size.
    fn brute(accesses: &[(u64, bool)], sizes: &[u64]) -> Vec<f64> {
        let mut stack: Vec<u64> = Vec::new(); // most recent last
        let mut dists = Vec::new();
        let mut lookups = 0usize;
        for &(k, lookup) in accesses {
            let pos = stack.iter().rposition(|&x| x == k);
            if lookup {
                lookups += 1;
                if let Some(p) = pos {
                    dists.push((stack.len() - 1 - p) as u64);
                }
            }
            if let Some(p) = pos {
                stack.remove(p);
            }
            stack.push(k);
        }
        sizes
            .iter()
            .map(|&c| dists.iter().filter(|&&d| d < c).count() as f64 / lookups as f64)
            .collect()
    }

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    }

    #[test]
    fn buckets_cover_every_distance_once() {
        for d in (0..5000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let b = bucket(d);
            let (low, width) = bucket_range(b);
            assert!(
                low <= d && d - low < width,
                "d={d} b={b} low={low} width={width}"
            );
        }
        assert_eq!(bucket(u64::MAX), NUM_BUCKETS - 1);
        for b in 1..NUM_BUCKETS {
            let (low, _) = bucket_range(b);
            let (plow, pwidth) = bucket_range(b - 1);
            assert_eq!(plow + pwidth, low);
        }
    }

    #[test]
    fn unsampled_curve_is_exact_lru() {
        // A small skewed workload: every page tracked (rate 1), distances exact below 64 pages.
        let mut seed = 7;
        let mut accesses = Vec::new();
        for _ in 0..20_000 {
            let r = lcg(&mut seed);
            let k = fmix(if r % 4 == 0 { r % 3000 } else { r % 40 });
            accesses.push((k, r % 5 != 0));
        }
        // Room for every distinct key (about 3,000), but a slot array that fills and is compacted
        // several times over the 20,000 uses.
        let mut m = MissRatioCurve::new(3_100, 1);
        for &(k, lookup) in &accesses {
            if lookup {
                m.record_lookup(1, &[k], 1);
            } else {
                m.record_filled(&[k]);
            }
        }
        assert_eq!(m.sample_rate(), 1.0);
        let sizes = [1, 2, 5, 10, 30, 40, 63];
        let want = brute(&accesses, &sizes);
        let got = m.hit_rates(&sizes);
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() < 1e-9, "want {want:?} got {got:?}");
        }
        // Above 64 pages buckets are ~3 % wide: within a point.
        let sizes = [100, 500, 1000, 2000, 2999, 5000];
        let want = brute(&accesses, &sizes);
        let got = m.hit_rates(&sizes);
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() < 0.01, "want {want:?} got {got:?}");
        }
    }

    #[test]
    fn sampled_curve_stays_close_with_bounded_memory() {
        let mut seed = 11;
        let mut accesses = Vec::new();
        for _ in 0..300_000 {
            let (class, r) = (lcg(&mut seed) % 10, lcg(&mut seed));
            // Skewed: hot keys and a long tail (about 70k distinct keys).
            let k = match class {
                0..=5 => r % 2_000,
                6..=8 => r % 20_000,
                _ => r % 200_000,
            };
            accesses.push((fmix(k), true));
        }
        let mut m = MissRatioCurve::new(2048, 1);
        for &(k, _) in &accesses {
            m.record_lookup(1, &[k], 1);
        }
        assert!(m.num_samples() <= 2048);
        assert!(m.sample_rate() < 0.05, "{}", m.sample_rate());
        let sizes = [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000];
        let want = brute_fast(&accesses, &sizes);
        let got = m.hit_rates(&sizes);
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() < 0.03, "want {want:?} got {got:?}");
        }
    }

    /// Exact distances with the curve itself unbounded (checked against `brute` above).
    fn brute_fast(accesses: &[(u64, bool)], sizes: &[u64]) -> Vec<f64> {
        let mut m = MissRatioCurve::new(accesses.len(), 1);
        let mut exact = Vec::new();
        for &(k, _) in accesses {
            let before = m
                .last
                .get(&k)
                .map(|&s| m.last.len() as u64 - m.prefix(s as usize));
            m.touch(k);
            exact.push(before);
        }
        sizes
            .iter()
            .map(|&c| {
                exact.iter().filter(|d| d.is_some_and(|d| d < c)).count() as f64
                    / accesses.len() as f64
            })
            .collect()
    }

    #[test]
    fn token_rate_counts_partial_pages_as_misses() {
        let mut m = MissRatioCurve::new(64, 16);
        // Two 40-token prompts over the same two full pages: the second hits 32 of its 40.
        m.record_lookup(40, &[fmix(1), fmix(2)], 2);
        m.record_lookup(40, &[fmix(1), fmix(2)], 2);
        let r = m.hit_rates(&[0, 1, 2, 100]);
        assert_eq!(r[0], 0.0);
        // One page of cache keeps the root (used last, deepest first): a 16-token hit.
        assert!((r[1] - 16.0 / 80.0).abs() < 1e-12, "{r:?}");
        assert!((r[2] - 32.0 / 80.0).abs() < 1e-12, "{r:?}");
        assert!((r[3] - 32.0 / 80.0).abs() < 1e-12);
        m.reset();
        assert_eq!(m.hit_rates(&[10]), vec![0.0]);
    }
}
