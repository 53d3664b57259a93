//! Page keys: a stable 128-bit identity for the K/V of every full page, so that another tier, another
//! instance or a KV-aware router can name a page without seeing its tokens.
//!
//! A key is chained: page `i`'s key hashes the key of page `i - 1` (the *parent*; the cache's root
//! key for page 0), the namespace and the page's tokens, so equal keys mean equal prefixes. The root
//! key hashes the cache *fingerprint* the engine gives the manager (model id, KV dtype, page size,
//! layout, version: whatever makes two caches' K/V interchangeable), so caches that must not share
//! pages never produce equal keys. Every field is length-framed (no two different inputs serialise to
//! the same bytes, e.g. a namespace ending in bytes that look like tokens), and the format carries a
//! version byte. SHA-256 (the `sha2` crate, SHA-NI where the CPU has it), truncated to 16 bytes.
//!
//! ```text
//! root  = SHA-256("kvcore.page-key" || u8 VERSION || u64le len(fp) || fp)[..16]
//! key_i = SHA-256(u8 VERSION || key_{i-1} (16 bytes) || u8 kind || u64le len(ns) || ns
//!                 || u64le num_tokens || u32le token ...)[..16]
//! kind  = 0 default namespace (ns empty), 1 a named namespace (ns = its UTF-8 bytes),
//!         2 the public namespace "*" (ns empty)
//! ```
//!
//! Test vectors are in `docs/api.md` (and checked against a `hashlib` reference in the tests).

use sha2::{Digest, Sha256};

/// Version of the key format above; bumped on any change.
pub const PAGE_KEY_VERSION: u8 = 1;

/// A page key.
pub type PageKey = [u8; 16];

/// The namespace a key is computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyNamespace<'a> {
    /// The default namespace (no name given).
    Default,
    /// The public namespace (`"*"`), visible from every namespace.
    Public,
    /// A named namespace (a tenant, a cache salt).
    Named(&'a str),
}

impl<'a> KeyNamespace<'a> {
    /// The key namespace of a namespace name: `None` the default, `"*"` the public one.
    pub fn of(name: Option<&'a str>) -> Self {
        match name {
            None => KeyNamespace::Default,
            Some(crate::manager::PUBLIC_NAMESPACE_NAME) => KeyNamespace::Public,
            Some(name) => KeyNamespace::Named(name),
        }
    }
}

fn truncate(digest: &[u8]) -> PageKey {
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// The root key of a cache with this fingerprint (the parent of every first page).
pub fn root_key(fingerprint: &[u8]) -> PageKey {
    let mut h = Sha256::new();
    h.update(b"kvcore.page-key");
    h.update([PAGE_KEY_VERSION]);
    h.update((fingerprint.len() as u64).to_le_bytes());
    h.update(fingerprint);
    truncate(&h.finalize())
}

/// The key of one page holding `tokens`, whose parent page has key `parent`.
pub fn page_key(parent: &PageKey, ns: KeyNamespace<'_>, tokens: &[u32]) -> PageKey {
    let (kind, name): (u8, &[u8]) = match ns {
        KeyNamespace::Default => (0, b""),
        KeyNamespace::Named(n) => (1, n.as_bytes()),
        KeyNamespace::Public => (2, b""),
    };
    let mut h = Sha256::new();
    h.update([PAGE_KEY_VERSION]);
    h.update(parent);
    h.update([kind]);
    h.update((name.len() as u64).to_le_bytes());
    h.update(name);
    h.update((tokens.len() as u64).to_le_bytes());
    // Little-endian u32s, a page at a time (no allocation per token).
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(buf.len() / 4) {
        for (dst, &t) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    truncate(&h.finalize())
}

/// Appends to `out` the keys of the full pages of `tokens` (`tokens.len() / page_size` of them),
/// chained from `root`.
pub fn page_keys(
    root: &PageKey,
    ns: KeyNamespace<'_>,
    tokens: &[u32],
    page_size: usize,
    out: &mut Vec<PageKey>,
) {
    page_keys_over_public(root, ns, tokens, page_size, 0, out);
}

/// [`page_keys`] of a path over a public prefix, as a cache keys it: the first `public_pages`
/// full pages in the public namespace, the rest in `ns`, chained from the last public key (a
/// tenant's pages after a shared system prompt). `public_pages` past the full pages counts them all.
pub fn page_keys_over_public(
    root: &PageKey,
    ns: KeyNamespace<'_>,
    tokens: &[u32],
    page_size: usize,
    public_pages: usize,
    out: &mut Vec<PageKey>,
) {
    if page_size == 0 {
        return;
    }
    let mut parent = *root;
    out.reserve(tokens.len() / page_size);
    for (i, page) in tokens.chunks_exact(page_size).enumerate() {
        let kns = if i < public_pages {
            KeyNamespace::Public
        } else {
            ns
        };
        parent = page_key(&parent, kns, page);
        out.push(parent);
    }
}

/// The 128-bit integrity checksum of a lower-tier value's payload: XXH3-128, little-endian.
///
/// For *integrity* (a torn write, a flipped byte, a truncated file), not identity: identity is the
/// page key above. XXH3 runs at memory speed, so checking a page costs less than reading it.
pub fn payload_checksum(data: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(data).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_and_frame_their_fields() {
        let root = root_key(b"model-a");
        assert_ne!(root, root_key(b"model-b"));
        let mut a = Vec::new();
        page_keys(
            &root,
            KeyNamespace::Default,
            &[1, 2, 3, 4, 5, 6, 7, 8],
            4,
            &mut a,
        );
        assert_eq!(a.len(), 2);
        assert_eq!(a[1], page_key(&a[0], KeyNamespace::Default, &[5, 6, 7, 8]));
        // The same page after another parent, or in another namespace, has another key.
        assert_ne!(page_key(&root, KeyNamespace::Default, &[5, 6, 7, 8]), a[1]);
        let named = page_key(&root, KeyNamespace::Named(""), &[1, 2, 3, 4]);
        assert_ne!(named, a[0]);
        assert_ne!(named, page_key(&root, KeyNamespace::Public, &[1, 2, 3, 4]));
        assert_eq!(
            page_key(&root, KeyNamespace::Named("t"), &[1]),
            page_key(&root, KeyNamespace::Named("t"), &[1])
        );
    }

    fn hex(key: &PageKey) -> String {
        key.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn the_documented_test_vectors() {
        let root = root_key(b"");
        assert_eq!(hex(&root), "446d559e37aaf1b85faba37567a44c43");
        let mut keys = Vec::new();
        page_keys(
            &root,
            KeyNamespace::Default,
            &[0, 1, 2, 3, 4, 5, 6, 7],
            4,
            &mut keys,
        );
        assert_eq!(hex(&keys[0]), "06b911dbf1cab835645347fc2796860e");
        assert_eq!(hex(&keys[1]), "9063070537fb1c559cbaa96bc2cea95d");
    }
}
