//! Unit tests of the tree's internals; the behaviour is tested against a model in
//! `tests/rust/radix.rs`.

use super::*;

fn pages_of(t: &RadixTree, node: NodeId) -> Vec<PageId> {
    t.nodes[node as usize].pages.clone()
}

#[test]
fn page_set_tracks_membership() {
    let mut s = PageSet::default();
    assert!(!s.contains(5));
    assert!(s.insert(5));
    assert!(!s.insert(5));
    assert!(s.insert(200));
    assert!(s.contains(5) && s.contains(200) && !s.contains(6));
    assert_eq!(s.len(), 2);
    s.remove(5);
    s.remove(100_000); // beyond the bitmap: nothing to do
    assert!(!s.contains(5));
    assert_eq!(s.len(), 1);
}

#[test]
fn freed_slots_are_reused_with_their_capacity() {
    let mut t = RadixTree::new(4, EvictionPolicy::Lru).unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    let pages: Vec<PageId> = (1..=16).collect();
    let a = t.insert(0, &tokens, &pages, 0, 0).unwrap().node;
    let cap = t.nodes[a as usize].tokens.capacity();
    let mut out = Vec::new();
    assert_eq!(t.evict(16, 1, &mut out), 16);
    assert_eq!(t.free_ids, [a]);
    let b = t.insert(0, &tokens[..8], &[40, 41], 0, 2).unwrap().node;
    assert_eq!(b, a, "the slot is reused");
    assert!(
        t.nodes[b as usize].tokens.capacity() >= cap,
        "and its vector kept"
    );
    assert_eq!(pages_of(&t, b), [40, 41]);
    t.check_invariants().unwrap();
}

#[test]
fn split_moves_the_head_into_a_new_parent() {
    let mut t = RadixTree::new(2, EvictionPolicy::Lfu).unwrap();
    let x = t
        .insert(3, &[1, 1, 2, 2, 3, 3], &[1, 2, 3], 5, 0)
        .unwrap()
        .node;
    let hits = t.nodes[x as usize].hits;
    let mut out = Vec::new();
    let r = t.match_prefix(3, &[1, 1, 2, 2, 9, 9], 0, 1, &mut out);
    let p = r.node;
    assert_eq!(pages_of(&t, p), [1, 2]);
    assert_eq!(pages_of(&t, x), [3]);
    assert_eq!(t.nodes[x as usize].parent, p);
    assert_eq!(t.nodes[p as usize].parent, ROOT);
    assert_eq!(t.nodes[p as usize].num_children, 1);
    assert_eq!(t.nodes[p as usize].priority, 5);
    assert_eq!(
        t.nodes[p as usize].hits,
        hits + 1,
        "inherited, then touched by the match"
    );
    assert_eq!(
        t.nodes[x as usize].hits, hits,
        "the deeper part was not matched"
    );
    t.check_invariants().unwrap();
}

#[test]
fn collision_chains_survive_splits_and_removals() {
    let mut t = RadixTree::new(1, EvictionPolicy::Lru).unwrap();
    t.force_hash_collisions_for_tests().unwrap();
    // Everything lands on key 0: one chain through every node, across parents and namespaces.
    t.insert(0, &[1, 2, 3], &[1, 2, 3], 0, 0).unwrap();
    t.insert(0, &[2, 3], &[4, 5], 0, 0).unwrap();
    t.insert(7, &[1, 2, 3], &[6, 7, 8], 0, 0).unwrap();
    t.insert(0, &[1, 2, 4], &[9, 10, 11], 0, 0).unwrap(); // splits [1,2,3]
    assert_eq!(t.children.len(), 1);
    t.check_invariants().unwrap();
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 3]), 3);
    assert_eq!(t.peek_prefix_len(0, &[1, 2, 4]), 3);
    assert_eq!(t.peek_prefix_len(7, &[1, 2, 4]), 2);
    assert_eq!(t.peek_prefix_len(8, &[1, 2, 4]), 0);
    let mut out = Vec::new();
    while t.evict(1, 1, &mut out) == 1 {
        t.check_invariants().unwrap();
    }
    assert!(t.children.is_empty());
}

#[test]
fn lru_touch_moves_the_path_behind_its_descendants() {
    let mut t = RadixTree::new(1, EvictionPolicy::Lru).unwrap();
    t.insert(0, &[1, 2], &[1, 2], 0, 0).unwrap();
    t.insert(0, &[1, 3], &[3, 4], 0, 0).unwrap(); // [1] -> {[2], [3]}
    t.insert(0, &[9], &[5], 0, 0).unwrap();
    let mut out = Vec::new();
    t.match_prefix(0, &[1, 2], 0, 1, &mut out);
    let order: Vec<Vec<PageId>> = t.index.iter().map(|id| pages_of(&t, id)).collect();
    assert_eq!(order, [vec![4], vec![5], vec![2], vec![1]]);
    t.check_invariants().unwrap();
}

#[test]
fn a_floor_keeps_a_namespace_last_in_eviction_order() {
    let mut t = RadixTree::new(1, EvictionPolicy::Lru).unwrap();
    let (quiet, noisy) = (7, 8);
    t.set_floor(quiet, 3).unwrap();
    // Quiet's 5 pages first (least recent), then noisy's 4.
    t.insert(quiet, &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5], 0, 0)
        .unwrap();
    t.insert(noisy, &[9, 8, 7, 6], &[6, 7, 8, 9], 0, 1).unwrap();
    assert_eq!(t.floor(quiet), Some((3, 5)));
    let mut out = Vec::new();
    // Quiet above its floor goes first (LRU), down to the floor exactly; then noisy's pages.
    assert_eq!(t.evict(4, 2, &mut out), 4);
    assert_eq!(t.floor(quiet), Some((3, 3)));
    assert_eq!(out[..2], [5, 4]);
    assert_eq!(out[2..], [9, 8]);
    t.check_invariants().unwrap();
    // Only floor pages and 2 noisy pages are left: the noisy ones first, then the floor yields.
    out.clear();
    assert_eq!(t.evict(3, 3, &mut out), 3);
    assert_eq!(out, [7, 6, 3]);
    assert_eq!(t.floor(quiet), Some((3, 2)));
    t.check_invariants().unwrap();
    assert!(t.set_floor(PUBLIC_NAMESPACE, 1).is_err());
    t.set_floor(quiet, 0).unwrap();
    assert_eq!(t.floor(quiet), None);
}

#[test]
fn peek_prefix_public_counts_the_public_pages_of_the_path_found() {
    let mut t = RadixTree::new(2, EvictionPolicy::Lru).unwrap();
    let tokens: Vec<u32> = (0..12).collect();
    let public = t
        .insert(PUBLIC_NAMESPACE, &tokens[..6], &[1, 2, 3], 0, 0)
        .unwrap();
    t.extend(7, public.node, &tokens[6..10], &[4, 5], 0, 0)
        .unwrap();
    assert_eq!(t.peek_prefix_public(7, &tokens), (5, 3));
    assert_eq!(t.peek_prefix_public(7, &tokens[..4]), (2, 2)); // inside the public node
    assert_eq!(t.peek_prefix_public(8, &tokens), (3, 3)); // another namespace sees the public pages
    assert_eq!(t.peek_prefix_public(PUBLIC_NAMESPACE, &tokens), (3, 3));
    // An insert from the root continues the public pages: namespace 9's fourth page hangs below.
    t.insert(9, &tokens[..8], &[6, 7, 8, 9], 0, 0).unwrap();
    assert_eq!(t.peek_prefix_public(9, &tokens), (4, 3));
    // A namespace's own branch from the root, made before the public copy (as a restore makes it):
    // the longer path, and no public page on it.
    let mut t = RadixTree::new(2, EvictionPolicy::Lru).unwrap();
    t.insert(10, &tokens[..10], &[10, 11, 12, 13, 14], 0, 0)
        .unwrap();
    t.insert(PUBLIC_NAMESPACE, &tokens[..6], &[1, 2, 3], 0, 0)
        .unwrap();
    assert_eq!(t.peek_prefix_public(10, &tokens), (5, 0));
    assert_eq!(t.peek_prefix_public(11, &tokens), (3, 3));
}

#[test]
fn peek_from_public_counts_the_public_pages_found_below_a_node() {
    let mut t = RadixTree::new(2, EvictionPolicy::Lru).unwrap();
    let tokens: Vec<u32> = (0..12).collect();
    let a = t
        .insert(PUBLIC_NAMESPACE, &tokens[..4], &[1, 2], 0, 0)
        .unwrap()
        .node;
    let b = t
        .extend(PUBLIC_NAMESPACE, a, &tokens[4..8], &[3, 4], 0, 0)
        .unwrap()
        .node;
    t.extend(7, b, &tokens[8..10], &[5], 0, 0).unwrap();
    assert_eq!(t.peek_from_public(7, ROOT, &tokens).unwrap(), (5, 4));
    assert_eq!(t.peek_from_public(7, a, &tokens[4..]).unwrap(), (3, 2));
    assert_eq!(t.peek_from_public(7, b, &tokens[8..]).unwrap(), (1, 0));
    assert_eq!(t.peek_from_public(7, b, &tokens[..2]).unwrap(), (0, 0)); // nothing there
    assert!(t.peek_from_public(7, 999, &tokens).is_err());
}

#[test]
fn extend_own_adds_a_namespace_copy_beside_a_public_one() {
    let mut t = RadixTree::new(2, EvictionPolicy::Lru).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    t.insert(PUBLIC_NAMESPACE, &tokens[..4], &[1, 2], 0, 0)
        .unwrap();
    // `extend` finds the public copy; `extend_own` adds namespace 7's own beside it.
    let found = t.extend(7, ROOT, &tokens[..2], &[3], 0, 0).unwrap();
    assert_eq!((found.num_existing_pages, found.num_adopted_pages), (1, 0));
    // The peeks agree with the two: the public copy is found, the namespace's own is not.
    assert_eq!(t.peek_len_from(7, ROOT, &tokens[..2]), Ok(1));
    assert_eq!(t.peek_own_len_from(7, ROOT, &tokens[..2]), Ok(0));
    assert_eq!(
        t.peek_own_len_from(PUBLIC_NAMESPACE, ROOT, &tokens[..4]),
        Ok(2)
    );
    assert!(t.peek_own_len_from(7, 999, &tokens).is_err());
    let own = t.extend_own(7, ROOT, &tokens[..2], &[3], 0, 0).unwrap();
    assert_eq!(t.peek_own_len_from(7, ROOT, &tokens[..4]), Ok(1));
    assert_eq!((own.num_existing_pages, own.num_adopted_pages), (0, 1));
    assert_eq!(pages_of(&t, own.node), vec![3]);
    // Found again as its own (no second copy), and continued in namespace 7.
    let again = t.extend_own(7, ROOT, &tokens[..2], &[4], 0, 0).unwrap();
    assert_eq!((again.node, again.num_adopted_pages), (own.node, 0));
    // A leaf locked once by someone else (a store in flight) never grows in place under
    // `extend_own`: its holder must find it ending where it did. (`extend`'s caller holds it.)
    t.lock(own.node).unwrap();
    let below = t
        .extend_own(7, own.node, &tokens[2..4], &[5], 0, 0)
        .unwrap();
    assert_ne!(below.node, own.node);
    assert_eq!(pages_of(&t, own.node), vec![3]);
    t.unlock(own.node).unwrap();
    assert_eq!(t.peek_prefix_public(7, &tokens[..4]), (2, 0));
    assert_eq!(t.peek_prefix_public(8, &tokens[..4]), (2, 2)); // others still see the public copy
                                                               // The public namespace's own is the public path.
    let public = t
        .extend_own(PUBLIC_NAMESPACE, ROOT, &tokens[..4], &[6, 7], 0, 0)
        .unwrap();
    assert_eq!(public.num_adopted_pages, 0);
    t.check_invariants().unwrap();
}
