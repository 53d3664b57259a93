//! The manager's miss-ratio curve ([`crate::mrc`]): each admission's looked-up pages and each
//! page that fills, keyed as the tree shares them (by namespace, a public prefix under `"*"`).
//!
//! Keys are a fast 64-bit chain (the tree's page hash, mixed with the parent's key), not the
//! SHA-256 page keys: the curve needs identity, not a wire format. A namespace enters the chain by
//! its name, so a name forgotten and seen again keys its pages as before.

use super::{unknown, KVCacheManager, SeqId, State};
use crate::error::KvResult;
use crate::mrc::{fmix, MissRatioCurve};
use crate::radix::hash_page;

/// The chain seed of the default namespace's pages.
const DEFAULT_SEED: u64 = 0x6b76_6d72_6364_6566;
/// The chain seed of public pages (`"*"`).
const PUBLIC_SEED: u64 = 0x6b76_6d72_6370_7562;

/// The chain seed of a namespace's own pages (FNV-1a of its name, mixed).
fn namespace_seed(name: Option<&str>) -> u64 {
    match name {
        None => DEFAULT_SEED,
        Some(super::PUBLIC_NAMESPACE_NAME) => PUBLIC_SEED,
        Some(n) => {
            let h = n.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            fmix(h ^ n.len() as u64)
        }
    }
}

/// Where a sequence's curve keys stand.
#[derive(Clone, Debug, Default)]
pub(super) struct MrcCursor {
    /// Leading full pages keyed (looked up or filled) so far.
    pages: usize,
    /// The key of the last of them (0: none).
    chain: u64,
    /// Leading pages keyed as public (the public prefix its admission matched).
    public: usize,
    /// The seed of its own pages.
    seed: u64,
    /// `(page index, key)` of its keyed pages the curve tracked, in page order: used again when
    /// the sequence ends (those below `inserted`).
    sampled: Vec<(u32, u64)>,
    /// Leading pages used as cached (the modelled LRU holds them): all those looked up for a
    /// sequence that caches its prompt, else its hit, then what it commits.
    inserted: usize,
    /// The key of page `inserted - 1` (0: none).
    inserted_chain: u64,
}

impl MrcCursor {
    fn new(name: Option<&str>, public: usize) -> Self {
        Self {
            public,
            seed: namespace_seed(name),
            ..Self::default()
        }
    }

    /// Appends the keys of `tokens`' full pages from `self.pages` up to `upto` to `out`, and keeps
    /// those `curve` tracks (if given).
    fn extend(
        &mut self,
        tokens: &[u32],
        ps: usize,
        upto: usize,
        curve: Option<&MissRatioCurve>,
        out: &mut Vec<u64>,
    ) {
        while self.pages < upto {
            let page = &tokens[self.pages * ps..(self.pages + 1) * ps];
            let seed = if self.pages < self.public {
                PUBLIC_SEED
            } else {
                self.seed
            };
            self.chain = fmix(self.chain.rotate_left(23) ^ hash_page(seed, page));
            out.push(self.chain);
            if curve.is_some_and(|c| c.samples(self.chain)) {
                self.sampled.push((self.pages as u32, self.chain));
            }
            self.pages += 1;
        }
    }
}

impl KVCacheManager {
    /// Record an admission's lookup of `prompt` (its full pages before the last token, the
    /// first `public` of them public; `hit` of them cached): the cursor its sequence continues
    /// from. With `caches` (it caches its prompt now) every page looked up is used as cached;
    /// else only its hit is used, and the other pages as they are committed
    /// ([`mrc_fill`](Self::mrc_fill): a chunked prefill's, never a streaming sequence's own).
    /// (Not a stack algorithm any more: a larger cache would have hit, and used, more of them;
    /// the curve is exact at the cache's own size and where the prompt is committed whole.)
    pub(super) fn mrc_lookup(
        &self,
        st: &mut State,
        namespace: Option<&str>,
        (public, hit): (usize, usize),
        prompt: &[u32],
        caches: bool,
    ) -> MrcCursor {
        let Some(curve) = st.mrc.as_deref_mut() else {
            return MrcCursor::default();
        };
        let ps = self.page_size;
        let mut cursor = MrcCursor::new(namespace, public);
        let keys = &mut st.mrc_keys;
        keys.clear();
        cursor.extend(prompt, ps, (prompt.len() - 1) / ps, Some(curve), keys);
        cursor.inserted = if caches {
            keys.len()
        } else {
            hit.min(keys.len())
        };
        curve.record_lookup(prompt.len(), keys, cursor.inserted);
        cursor.inserted_chain = cursor.inserted.checked_sub(1).map_or(0, |i| keys[i]);
        cursor
    }

    /// `seq_id`'s first `full` pages are computed: record those not keyed yet as used.
    pub(super) fn mrc_fill(&self, st: &mut State, seq_id: SeqId, full: usize) -> KvResult<()> {
        let State {
            mrc,
            mrc_keys,
            seqs,
            ..
        } = st;
        let Some(curve) = mrc.as_deref_mut() else {
            return Ok(());
        };
        let seq = seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let c = &mut seq.mrc;
        if c.inserted >= full {
            return Ok(());
        }
        let ps = self.page_size;
        mrc_keys.clear();
        if c.inserted < c.pages {
            // Looked up but not cached then (a sequence that caches as it commits): keyed again.
            let mut again = MrcCursor {
                pages: c.inserted,
                chain: c.inserted_chain,
                sampled: Vec::new(),
                ..*c
            };
            again.extend(&seq.tokens, ps, full.min(c.pages), None, mrc_keys);
        }
        c.extend(&seq.tokens, ps, full, Some(curve), mrc_keys);
        curve.record_filled(mrc_keys);
        if let Some(&k) = mrc_keys.last() {
            c.inserted_chain = k;
        }
        c.inserted = full;
        Ok(())
    }

    /// A sequence ends: its path is used again, deepest first (the tree stamps it as it unlocks).
    pub(super) fn mrc_release(st: &mut State, cursor: &MrcCursor) {
        if let Some(curve) = st.mrc.as_deref_mut() {
            let cached = cursor
                .sampled
                .iter()
                .filter(|&&(i, _)| (i as usize) < cursor.inserted);
            curve.record_release(cached.map(|&(_, k)| k));
        }
    }

    /// `seq_id` was cut to `full` whole pages: its cursor goes back to them (keys recomputed, a
    /// rare path: rejected drafts that cross a page).
    pub(super) fn mrc_truncate(&self, st: &mut State, seq_id: SeqId, full: usize) -> KvResult<()> {
        let State { mrc, seqs, .. } = st;
        let Some(curve) = mrc.as_deref() else {
            return Ok(());
        };
        let seq = seqs.get_mut(&seq_id).ok_or_else(|| unknown(seq_id))?;
        if seq.mrc.pages <= full {
            return Ok(());
        }
        let mut cursor = MrcCursor {
            pages: 0,
            chain: 0,
            sampled: Vec::new(),
            ..seq.mrc
        };
        cursor.extend(
            &seq.tokens,
            self.page_size,
            full,
            Some(curve),
            &mut Vec::new(),
        );
        // The pages kept were tracked when keyed (or dropped since, for good).
        cursor.sampled = std::mem::take(&mut seq.mrc.sampled);
        cursor.sampled.retain(|&(i, _)| (i as usize) < full);
        if cursor.inserted > full {
            cursor.inserted = full;
            cursor.inserted_chain = cursor.chain;
        }
        seq.mrc = cursor;
        Ok(())
    }

    /// Turn the miss-ratio curve on, tracking at most `max_samples` pages (>= 1; a fresh curve,
    /// counting from the next admission), or off (`None`).
    pub fn set_miss_ratio_curve(&self, max_samples: Option<usize>) {
        let mut st = self.state.lock();
        st.mrc = max_samples.map(|n| Box::new(MissRatioCurve::new(n, self.page_size)));
    }

    /// Forget what the curve has seen (it stays on). False if it is off.
    pub fn reset_miss_ratio_curve(&self) -> bool {
        let mut st = self.state.lock();
        match st.mrc.as_deref_mut() {
            Some(c) => {
                c.reset();
                true
            }
            None => false,
        }
    }

    /// The curve's hit rates at `sizes` (pages; `None`: [`default_sizes`](Self::mrc_default_sizes))
    /// and its state, or None when it is off.
    pub fn miss_ratio_curve(&self, sizes: Option<&[u64]>) -> Option<MrcReport> {
        let st = self.state.lock();
        let c = st.mrc.as_deref()?;
        let sizes = match sizes {
            Some(s) => s.to_vec(),
            None => self.mrc_default_sizes(&st, c.max_distance()),
        };
        Some(MrcReport {
            hit_rates: c.hit_rates(&sizes),
            sizes,
            sample_rate: c.sample_rate(),
            num_samples: c.num_samples(),
            max_samples: c.max_samples(),
            lookup_pages: c.lookup_pages(),
            prompt_tokens: c.prompt_tokens(),
            max_distance: c.max_distance(),
        })
    }

    /// The sizes a curve is read at by default, ascending: HBM's usable pages times 1/8 .. 16 (by
    /// powers of two), HBM plus each lower tier's slots in turn (an inclusive hierarchy's reach),
    /// and the largest distance seen (where the curve reaches its ceiling).
    fn mrc_default_sizes(&self, st: &State, max_distance: u64) -> Vec<u64> {
        let hbm = (self.num_pages() - 1) as u64;
        let mut sizes: Vec<u64> = (0..8).map(|i| (hbm << i) / 8).collect();
        let mut reach = hbm;
        for t in &st.tiers {
            reach += t.stats().num_slots as u64;
            sizes.push(reach);
        }
        sizes.push(max_distance);
        sizes.retain(|&s| s > 0);
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

/// What [`KVCacheManager::miss_ratio_curve`] reads.
#[derive(Clone, Debug, PartialEq)]
pub struct MrcReport {
    /// Cache sizes, in pages.
    pub sizes: Vec<u64>,
    /// The prompt-token hit rate an LRU cache of each size would have had.
    pub hit_rates: Vec<f64>,
    /// The sampling rate now (1.0: every page tracked, the curve is exact).
    pub sample_rate: f64,
    /// Pages tracked now.
    pub num_samples: usize,
    /// The bound on tracked pages.
    pub max_samples: usize,
    /// Full pages looked up since the curve started.
    pub lookup_pages: u64,
    /// Prompt tokens looked up since the curve started.
    pub prompt_tokens: u64,
    /// The largest reuse distance seen, in pages (past it the curve is flat).
    pub max_distance: u64,
}
