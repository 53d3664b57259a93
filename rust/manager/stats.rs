//! The usage split and counters ([`CacheStats`]), declared once.

/// Defines [`CacheStats`] from one list of fields: the struct (a Python class too, with the
/// `python` feature), its field names and its values, so no other place lists them.
macro_rules! cache_stats {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty,)+) => {
        /// The usage split and counters, read in one consistent snapshot.
        #[cfg_attr(
            feature = "python",
            pyo3::pyclass(name = "CacheStats", module = "kvcore._kvcore", frozen, get_all, eq)
        )]
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct CacheStats {
            $($(#[doc = $doc])+ pub $name: $ty,)+
        }

        impl CacheStats {
            /// The field names, in declaration order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($name)),+];

            /// The field values, in [`FIELDS`](Self::FIELDS) order.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$name as u64),+]
            }

            /// The stats of these [`values`](Self::values) (None: another number of them).
            pub fn from_values(values: &[u64]) -> Option<Self> {
                let mut it = values.iter().copied();
                let stats = Self { $($name: it.next()? as $ty,)+ };
                it.next().is_none().then_some(stats)
            }
        }
    };
}

cache_stats! {
    /// Usable pages (`num_pages - 1`); the four splits below sum to it.
    num_pages_total: usize,
    /// Held by a live sequence, protected by its lock, held for a queued copy (or locked because
    /// a queued copy's source was cached), or held by the caller (`allocate_pages`).
    num_pages_in_use: usize,
    /// Cached and evictable (only the tree holds them, nothing protects them).
    num_pages_cached: usize,
    /// Cached and protected by an unexpired TTL pin (and no lock).
    num_pages_pinned: usize,
    /// In the allocator's free pool.
    num_pages_free: usize,
    /// Live sequences.
    num_sequences: usize,
    /// Prompt tokens looked up by `add_sequence` since creation (admitted requests).
    prefix_query_tokens: u64,
    /// Of those, tokens found cached.
    prefix_hit_tokens: u64,
    /// Pages evicted from the tree since creation.
    num_evicted_pages: u64,
    /// Copy-on-write page copies queued since creation.
    num_cow_copies: u64,
    /// `add_sequence` / `append` calls refused for lack of pages.
    num_refused: u64,
}

impl CacheStats {
    /// Fraction of looked-up prompt tokens that were cached (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_query_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_query_tokens as f64
        }
    }

    /// Fraction of usable pages in use (held or protected for live sequences, queued copies or the
    /// caller): what a scheduler admits against. Cached and pinned pages are not counted, as
    /// vLLM's `kv_cache_usage_perc` does not count cached blocks: they are given back on demand.
    pub fn usage(&self) -> f64 {
        if self.num_pages_total == 0 {
            0.0
        } else {
            self.num_pages_in_use as f64 / self.num_pages_total as f64
        }
    }

    /// Fraction of usable pages not free (in use, cached or pinned): how full the pool looks.
    pub fn occupancy(&self) -> f64 {
        if self.num_pages_total == 0 {
            0.0
        } else {
            1.0 - self.num_pages_free as f64 / self.num_pages_total as f64
        }
    }
}
