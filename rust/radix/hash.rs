//! Fast non-cryptographic hashing for the child map: one hash per page boundary.
//!
//! The multiply-rotate step is rustc's FxHash (Firefox's hash). It is weak on its own, so every
//! tree mixes in a per-process random seed (a tenant cannot precompute colliding pages), and the
//! map never trusts it: a hit is confirmed by comparing the parent, the namespace and the page's
//! tokens, and nodes whose keys collide are chained (see `RadixTree::child`).

use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// FxHash's multiplier (2^64 / golden ratio, odd).
const K: u64 = 0x517c_c1b7_2722_0a95;

#[inline(always)]
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(K)
}

/// The hash of one page of tokens, seeded. Two lanes of 64-bit words give the CPU independent
/// multiply chains (a 16-token page is 4 dependent multiplies per lane).
#[inline]
pub(crate) fn hash_page(seed: u64, tokens: &[u32]) -> u64 {
    let mut a = seed;
    let mut b = seed ^ K;
    let mut quads = tokens.chunks_exact(4);
    for q in &mut quads {
        a = mix(a, u64::from(q[0]) | (u64::from(q[1]) << 32));
        b = mix(b, u64::from(q[2]) | (u64::from(q[3]) << 32));
    }
    for &t in quads.remainder() {
        a = mix(a, u64::from(t));
    }
    mix(a, b.rotate_left(32) ^ tokens.len() as u64)
}

/// The child-map key of the child of `parent`, owned by `ns`, whose first page hashes to
/// `page_hash`. Different triples may collide: lookups confirm parent, namespace and tokens.
#[inline]
pub(crate) fn child_key(parent: u32, ns: u64, page_hash: u64) -> u64 {
    mix(mix(page_hash, u64::from(parent)), ns)
}

/// A fresh random seed (from std's per-process `RandomState` keys).
pub(crate) fn random_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x6b76_636f_7265_u64)
}

/// FxHash as a `Hasher`, for the child map whose keys are already well-mixed integers.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.hash = mix(self.hash, u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.hash = mix(self.hash, u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.hash = mix(self.hash, i);
    }

    /// A multiply leaves the low bits weak, and hashbrown picks buckets with them: fold the
    /// high half down (murmur3's finalizer, halved) so the probe sequences stay short.
    #[inline]
    fn finish(&self) -> u64 {
        let h = self.hash ^ (self.hash >> 32);
        h.wrapping_mul(0xff51_afd7_ed55_8ccd) ^ (h >> 29)
    }
}

/// `BuildHasher` for [`FxHasher`].
pub(crate) type FxBuildHasher = BuildHasherDefault<FxHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_hash_depends_on_every_token_and_the_seed() {
        let page: Vec<u32> = (0..16).collect();
        let h = hash_page(1, &page);
        for i in 0..page.len() {
            let mut other = page.clone();
            other[i] += 1;
            assert_ne!(hash_page(1, &other), h, "token {i} ignored");
        }
        assert_ne!(hash_page(2, &page), h);
        assert_ne!(hash_page(1, &page[..15]), h);
        assert_eq!(hash_page(1, &page), h);
        // Odd lengths use the remainder path.
        assert_ne!(hash_page(1, &[1, 2, 3]), hash_page(1, &[1, 2, 4]));
    }

    #[test]
    fn fx_hasher_mixes_bytes() {
        let mut a = FxHasher::default();
        a.write(&[1, 2, 3]);
        let mut b = FxHasher::default();
        b.write(&[1, 2, 4]);
        assert_ne!(a.finish(), b.finish());
        assert_ne!(random_seed(), 0x6b76_636f_7265);
        assert_ne!(child_key(1, 0, 5), child_key(2, 0, 5));
        assert_ne!(child_key(1, 0, 5), child_key(1, 3, 5));
        assert_ne!(child_key(1, 0, 5), child_key(1, 0, 6));
    }
}
