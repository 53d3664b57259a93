//! The eviction index: which cached item goes first when memory runs short (F5).
//!
//! The radix tree ([`crate::radix`]) keeps here every node that may be evicted now (unlocked,
//! unpinned), so that a victim is found without a scan. SGLang's `evict` builds a heap over every
//! leaf on each call; here the order is kept up to date as nodes are used.
//!
//! # Structure
//! Items are grouped into *levels* by [`EvictKey::primary`] (0 for every item under Lru, the hit
//! count under Lfu, the priority under Priority). Each level is an intrusive doubly-linked list
//! in recency order, so items are in `(primary, last use)` order. The lists store their links in
//! one `Vec` indexed by id (vLLM's `FreeKVCacheBlockQueue`, without the pointers). Each link names
//! its level's slot in a small slab, and a `BTreeMap` from level to slot orders the non-empty
//! levels.
//!
//! Costs: remove, move-to-back within a level and pop are O(1). Only a change of level (an Lfu
//! touch, a Priority raise), a level's first item arriving and its last one leaving cost an
//! O(log L) map operation (L = number of non-empty levels: 1 under Lru, a few priorities, more
//! hit counts). Nothing is allocated per operation once the tables have grown, except the map's
//! nodes as levels come and go.
//!
//! # Why interior nodes are in the index
//! The tree touches a path deepest node first, and hits and priority can only grow going up a
//! path. So within a level a node comes after all its descendants, and no descendant sits in a
//! higher level. The front of the lowest level is therefore always a leaf. A parent whose last
//! child is evicted is already in its right place, and needs no O(log n) re-insertion.
//!
//! Ids are dense `u32` slab indices (the tree's `NodeId`s); `u32::MAX` is reserved.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{KvError, KvResult};

/// How the eviction index orders its victims. Parsed from `"lru"`, `"lfu"`, `"priority"`
/// (ASCII case-insensitive).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EvictionPolicy {
    /// Least recently used first (the default).
    #[default]
    Lru,
    /// Fewest hits first; least recently used among equal hit counts.
    Lfu,
    /// Lowest priority first; least recently used within one priority.
    Priority,
}

impl EvictionPolicy {
    /// Every policy, in declaration order.
    pub const ALL: [EvictionPolicy; 3] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Priority,
    ];

    /// The name `FromStr` accepts: `"lru"`, `"lfu"` or `"priority"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Priority => "priority",
        }
    }

    /// The sort key of an item with `hits` uses, `priority`, last used at `tick` (a strictly
    /// increasing counter). Smaller keys are evicted first.
    pub fn key(self, hits: u64, priority: i32, tick: u64) -> EvictKey {
        let primary = match self {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Lfu => hits,
            // Order-preserving map of i32 onto u64: i32::MIN -> 0.
            EvictionPolicy::Priority => (i64::from(priority) - i64::from(i32::MIN)) as u64,
        };
        EvictKey { primary, tick }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EvictionPolicy {
    type Err = KvError;

    fn from_str(s: &str) -> KvResult<Self> {
        EvictionPolicy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                KvError::InvalidArgument(format!(
                    "unknown eviction policy {s:?} (expected \"lru\", \"lfu\" or \"priority\")"
                ))
            })
    }
}

/// An item's place in eviction order: smaller first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EvictKey {
    /// The level: 0 (Lru), hits (Lfu) or the biased priority (Priority).
    pub primary: u64,
    /// Last use, a strictly increasing counter: least recently used first within a level. The
    /// index does not store it; an item's place within its level is where the last
    /// `insert`/`touch` put it (at the back), so ticks must grow with those calls.
    pub tick: u64,
}

/// "No neighbour".
const NIL: u32 = u32::MAX;

/// One id's links.
#[derive(Clone, Copy, Debug)]
struct Link {
    /// Towards the front (next victim) of its level, or `NIL`.
    prev: u32,
    /// Towards the back (most recently used) of its level, or `NIL`.
    next: u32,
    /// Its level's slot in `EvictionIndex::slots`, or `NIL` when the id is not in the index.
    slot: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
    slot: NIL,
};

/// A non-empty level (or, on the free list, a spare slot).
#[derive(Clone, Copy, Debug)]
struct Level {
    /// `EvictKey::primary` of its items.
    key: u64,
    /// Front (next victim).
    head: u32,
    /// Back (most recently used).
    tail: u32,
}

/// The evictable items in eviction order (see the module docs).
///
/// Misuse (inserting an id twice, removing or touching an absent one, the reserved id
/// `u32::MAX`) changes nothing and is flagged by `debug_assert!`.
#[derive(Clone, Debug)]
pub struct EvictionIndex {
    /// The order in use.
    policy: EvictionPolicy,
    /// `links[id]` for every id seen so far: `[max_id + 1]`.
    links: Vec<Link>,
    /// Level slots: the live ones are named by `levels`, the others are on `free_slots`.
    slots: Vec<Level>,
    /// Spare indices into `slots`.
    free_slots: Vec<u32>,
    /// Non-empty levels, lowest (next victims) first: level -> slot.
    levels: BTreeMap<u64, u32>,
    /// Number of linked ids.
    len: usize,
}

impl EvictionIndex {
    /// An empty index ordered by `policy`.
    pub fn new(policy: EvictionPolicy) -> Self {
        EvictionIndex {
            policy,
            links: Vec::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            levels: BTreeMap::new(),
            len: 0,
        }
    }

    /// The order in use.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Number of items in the index.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `id` is in the index.
    pub fn contains(&self, id: u32) -> bool {
        self.links.get(id as usize).is_some_and(|l| l.slot != NIL)
    }

    /// The level `id` is in, if it is in the index.
    pub fn level_of(&self, id: u32) -> Option<u64> {
        self.links
            .get(id as usize)
            .filter(|l| l.slot != NIL)
            .map(|l| self.slots[l.slot as usize].key)
    }

    /// Adds `id` at the back of level `key.primary` (the most recently used of its level).
    pub fn insert(&mut self, id: u32, key: EvictKey) {
        if !self.prepare(id) {
            return;
        }
        self.push_back(id, key.primary);
    }

    /// Adds `id` just after `anchor` (one step more recent) if `key` puts it in `anchor`'s
    /// level; otherwise as [`insert`](Self::insert).
    pub fn insert_after(&mut self, anchor: u32, id: u32, key: EvictKey) {
        if self.level_of(anchor) != Some(key.primary) {
            self.insert(id, key);
            return;
        }
        if !self.prepare(id) {
            return;
        }
        let Link { next, slot, .. } = self.links[anchor as usize];
        self.link(id, slot, anchor, next);
    }

    /// Removes `id`.
    pub fn remove(&mut self, id: u32) {
        if !self.contains(id) {
            debug_assert!(false, "eviction index: {id} removed but absent");
            return;
        }
        self.unlink(id);
    }

    /// Records a use of `id`, whose key becomes `new`: it moves to the back of level
    /// `new.primary`.
    pub fn touch(&mut self, id: u32, new: EvictKey) {
        if !self.contains(id) {
            debug_assert!(false, "eviction index: {id} touched but absent");
            return;
        }
        let link = self.links[id as usize];
        let slot = link.slot;
        if self.slots[slot as usize].key == new.primary {
            if link.next != NIL {
                // Same level, not yet its back: O(1), no map operation.
                self.unlink(id);
                let tail = self.slots[slot as usize].tail;
                self.link(id, slot, tail, NIL);
            }
            return;
        }
        self.unlink(id);
        self.push_back(id, new.primary);
    }

    /// The next victim, if any (not removed): the front of the lowest level.
    pub fn peek(&self) -> Option<u32> {
        self.levels
            .first_key_value()
            .map(|(_, &slot)| self.slots[slot as usize].head)
    }

    /// Removes and returns the next victim.
    pub fn pop(&mut self) -> Option<u32> {
        let id = self.peek()?;
        self.unlink(id);
        Some(id)
    }

    /// The items in eviction order, next victim first (for invariant checks and tests; O(n)).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.levels.values().flat_map(move |&slot| {
            let mut cur = self.slots[slot as usize].head;
            std::iter::from_fn(move || {
                if cur == NIL {
                    return None;
                }
                let id = cur;
                cur = self.links[id as usize].next;
                Some(id)
            })
        })
    }

    /// Grows the link table to hold `id`; false if `id` is reserved or already linked.
    fn prepare(&mut self, id: u32) -> bool {
        if id == NIL || self.contains(id) {
            debug_assert!(false, "eviction index: bad insert of {id}");
            return false;
        }
        let idx = id as usize;
        if idx >= self.links.len() {
            self.links.resize(idx + 1, UNLINKED);
        }
        true
    }

    /// Links `id` at the back of `level`, creating the level if needed.
    fn push_back(&mut self, id: u32, level: u64) {
        let slot = match self.levels.get(&level) {
            Some(&slot) => slot,
            None => {
                let fresh = Level {
                    key: level,
                    head: NIL,
                    tail: NIL,
                };
                let slot = match self.free_slots.pop() {
                    Some(slot) => {
                        self.slots[slot as usize] = fresh;
                        slot
                    }
                    None => {
                        self.slots.push(fresh);
                        (self.slots.len() - 1) as u32
                    }
                };
                self.levels.insert(level, slot);
                slot
            }
        };
        let tail = self.slots[slot as usize].tail;
        self.link(id, slot, tail, NIL);
    }

    /// Links the unlinked `id` into the level at `slot`, between `prev` and `next` (either may
    /// be `NIL`, meaning that end of the level).
    fn link(&mut self, id: u32, slot: u32, prev: u32, next: u32) {
        self.links[id as usize] = Link { prev, next, slot };
        let level = &mut self.slots[slot as usize];
        if prev == NIL {
            level.head = id;
        } else {
            self.links[prev as usize].next = id;
        }
        if next == NIL {
            level.tail = id;
        } else {
            self.links[next as usize].prev = id;
        }
        self.len += 1;
    }

    /// Unlinks `id`, dropping its level if it was the last item there.
    fn unlink(&mut self, id: u32) {
        let Link { prev, next, slot } = self.links[id as usize];
        let level = &mut self.slots[slot as usize];
        if prev == NIL {
            level.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            level.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        if level.head == NIL {
            let key = level.key;
            self.levels.remove(&key);
            self.free_slots.push(slot);
        }
        self.links[id as usize] = UNLINKED;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(primary: u64) -> EvictKey {
        EvictKey { primary, tick: 0 }
    }

    fn order(ix: &EvictionIndex) -> Vec<u32> {
        ix.iter().collect()
    }

    #[test]
    fn policy_parses_and_prints() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.as_str().parse::<EvictionPolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!("LRU".parse::<EvictionPolicy>(), Ok(EvictionPolicy::Lru));
        assert!(matches!(
            "fifo".parse::<EvictionPolicy>(),
            Err(KvError::InvalidArgument(_))
        ));
        assert_eq!(EvictionPolicy::default(), EvictionPolicy::Lru);
    }

    #[test]
    fn keys_order_as_documented() {
        let p = EvictionPolicy::Priority;
        assert!(p.key(0, i32::MIN, 5) < p.key(0, -1, 0));
        assert!(p.key(0, -1, 9) < p.key(0, 0, 0));
        assert!(p.key(0, 0, 1) < p.key(0, 0, 2));
        assert!(p.key(0, 7, 0) < p.key(0, i32::MAX, 0));
        assert_eq!(p.key(0, i32::MAX, 0).primary, u64::from(u32::MAX));
        assert_eq!(EvictionPolicy::Lfu.key(7, 3, 1).primary, 7);
        assert_eq!(EvictionPolicy::Lru.key(7, 3, 1).primary, 0);
    }

    #[test]
    fn one_level_is_an_lru_list() {
        let mut ix = EvictionIndex::new(EvictionPolicy::Lru);
        assert!(ix.is_empty());
        for id in [3, 1, 7] {
            ix.insert(id, k(0));
        }
        assert_eq!(order(&ix), [3, 1, 7]);
        ix.touch(3, k(0));
        assert_eq!(order(&ix), [1, 7, 3]);
        ix.touch(3, k(0));
        assert_eq!(order(&ix), [1, 7, 3]);
        ix.insert_after(1, 5, k(0));
        ix.insert_after(3, 9, k(0));
        assert_eq!(order(&ix), [1, 5, 7, 3, 9]);
        ix.remove(7);
        assert_eq!(order(&ix), [1, 5, 3, 9]);
        assert_eq!(ix.pop(), Some(1));
        assert_eq!(ix.peek(), Some(5));
        assert_eq!(ix.len(), 3);
        assert!(ix.contains(9) && !ix.contains(1) && !ix.contains(1000));
        while ix.pop().is_some() {}
        assert!(ix.is_empty() && ix.peek().is_none());
    }

    #[test]
    fn levels_pop_lowest_first_lru_within() {
        let mut ix = EvictionIndex::new(EvictionPolicy::Lfu);
        ix.insert(1, k(3));
        ix.insert(2, k(1));
        ix.insert(3, k(1));
        ix.insert(4, k(2));
        assert_eq!(order(&ix), [2, 3, 4, 1]);
        ix.touch(2, k(2)); // 2 moves up a level, to its back
        assert_eq!(order(&ix), [3, 4, 2, 1]);
        assert_eq!(ix.level_of(2), Some(2));
        // insert_after in another level behaves as insert.
        ix.insert_after(3, 5, k(3));
        assert_eq!(order(&ix), [3, 4, 2, 1, 5]);
        ix.insert_after(4, 6, k(2));
        assert_eq!(order(&ix), [3, 4, 6, 2, 1, 5]);
        ix.remove(3);
        assert_eq!(ix.peek(), Some(4));
        let drained: Vec<u32> = std::iter::from_fn(|| ix.pop()).collect();
        assert_eq!(drained, [4, 6, 2, 1, 5]);
        assert!(ix.levels.is_empty());
        assert_eq!(ix.free_slots.len(), ix.slots.len());
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn misuse_changes_nothing() {
        let mut ix = EvictionIndex::new(EvictionPolicy::Lru);
        ix.insert(1, k(0));
        ix.insert(1, k(0));
        ix.insert(u32::MAX, k(0));
        ix.remove(2);
        ix.touch(2, k(0));
        assert_eq!(order(&ix), [1]);
    }
}
