//! Brute-force invariant check of a [`RadixTree`] (for tests; O(n log n)).

use std::collections::{HashMap, HashSet};

use super::{Class, Namespace, Node, NodeId, RadixTree, NIL, PUBLIC_NAMESPACE, ROOT};

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

pub(super) fn check(t: &RadixTree) -> Result<(), String> {
    let ps = t.page_size;
    let root = &t.nodes[ROOT as usize];
    ensure!(root.live && root.parent == NIL, "bad root");
    ensure!(
        root.pages.is_empty() && root.lock_ref == 0 && root.pin_ref == 0 && !root.in_index,
        "root holds state"
    );

    let live: Vec<NodeId> = (1..t.nodes.len() as NodeId)
        .filter(|&i| t.nodes[i as usize].live)
        .collect();
    let free: HashSet<NodeId> = t.free_ids.iter().copied().collect();
    ensure!(free.len() == t.free_ids.len(), "free list has duplicates");
    ensure!(
        live.len() + free.len() + 1 == t.nodes.len(),
        "slab: {} live + {} free + root != {}",
        live.len(),
        free.len(),
        t.nodes.len()
    );
    for &f in &free {
        ensure!(
            f != ROOT && !t.nodes[f as usize].live,
            "free id {f} is live"
        );
    }

    let mut num_children: HashMap<NodeId, u32> = HashMap::new();
    let mut pin_ref_below: HashMap<NodeId, u32> = HashMap::new();
    let mut lock_ref_below: HashMap<NodeId, u64> = HashMap::new();
    let mut first_pages: HashSet<(NodeId, u64, &[u32])> = HashSet::new();
    let mut seen_pages = HashSet::new();
    let (mut evictable, mut locked, mut pinned, mut covered) = (0, 0, 0, 0);
    let mut num_public = 0;
    let mut ns_nodes: HashMap<Namespace, usize> = HashMap::new();
    for &id in &live {
        let n: &Node = &t.nodes[id as usize];
        if n.ns != PUBLIC_NAMESPACE {
            *ns_nodes.entry(n.ns).or_default() += 1;
        }
        ensure!(!n.pages.is_empty(), "node {id} holds no page");
        ensure!(
            n.tokens.len() == n.pages.len() * ps,
            "node {id}: {} tokens for {} pages",
            n.tokens.len(),
            n.pages.len()
        );
        let parent = t
            .live_node(n.parent)
            .ok_or_else(|| format!("node {id}: dead parent {}", n.parent))?;
        *num_children.entry(n.parent).or_default() += 1;
        *pin_ref_below.entry(n.parent).or_default() += n.pin_ref;
        *lock_ref_below.entry(n.parent).or_default() += n.lock_ref;
        if n.ns == PUBLIC_NAMESPACE {
            num_public += 1;
            ensure!(
                parent.ns == PUBLIC_NAMESPACE,
                "public node {id} under a private node"
            );
        } else if n.parent != ROOT {
            ensure!(
                parent.ns == PUBLIC_NAMESPACE || parent.ns == n.ns,
                "node {id} of namespace {} under namespace {}",
                n.ns,
                parent.ns
            );
        }
        ensure!(
            first_pages.insert((n.parent, n.ns, &n.tokens[..ps])),
            "node {id}: a sibling of the same namespace starts with the same page"
        );
        ensure!(
            n.key == t.child_key(n.parent, n.ns, t.hash(&n.tokens[..ps])),
            "node {id}: stale child-map key"
        );
        // The child map reaches it.
        let mut c = *t
            .children
            .get(&n.key)
            .ok_or_else(|| format!("node {id} missing from the child map"))?;
        let mut steps = 0;
        while c != id {
            c = t.nodes[c as usize].chain_next;
            steps += 1;
            ensure!(
                c != NIL && steps <= live.len(),
                "node {id} not in its chain"
            );
        }
        for &p in &n.pages {
            ensure!(p != crate::NULL_PAGE, "node {id} holds the null page");
            ensure!(seen_pages.insert(p), "page {p} held twice");
            ensure!(t.in_tree.contains(p), "page {p} missing from the page set");
        }
        let num = n.pages.len();
        match n.class() {
            Class::Evictable => evictable += num,
            Class::Locked => locked += num,
            Class::Pinned => pinned += num,
        }
        if n.pin_ref > 0 {
            covered += num;
        }
        if n.pin_expiry != 0 {
            ensure!(
                t.pins.contains(&(n.pin_expiry, n.pin_seq, id)),
                "pin of node {id} not in the expiry set"
            );
        }
        ensure!(
            n.in_index == t.wants_index(id),
            "node {id}: in_index = {} but should be {}",
            n.in_index,
            !n.in_index
        );
        if n.in_index {
            ensure!(
                t.index.level_of(id) == Some(t.key_of(id).primary),
                "node {id} missing from the eviction index, or in a stale level"
            );
        }
    }
    let map_entries: usize = t
        .children
        .values()
        .map(|&head| {
            let mut len = 0;
            let mut c = head;
            while c != NIL && len <= live.len() {
                len += 1;
                c = t.nodes[c as usize].chain_next;
            }
            len
        })
        .sum();
    ensure!(
        map_entries == live.len(),
        "child map holds {map_entries} entries for {} nodes",
        live.len()
    );
    ensure!(num_public == t.num_public_nodes, "public node count");
    ensure!(
        ns_nodes == t.ns_nodes,
        "nodes per namespace: counted {ns_nodes:?}, kept {:?}",
        t.ns_nodes
    );
    ensure!(
        seen_pages.len() == t.in_tree.len(),
        "page set holds {} pages, nodes {}",
        t.in_tree.len(),
        seen_pages.len()
    );

    for id in std::iter::once(ROOT).chain(live.iter().copied()) {
        let n = &t.nodes[id as usize];
        let children = num_children.get(&id).copied().unwrap_or(0);
        ensure!(
            n.num_children == children,
            "node {id}: num_children {} != {children}",
            n.num_children
        );
        if id == ROOT {
            continue;
        }
        let pins_below = pin_ref_below.get(&id).copied().unwrap_or(0);
        ensure!(
            n.pin_ref == pins_below + u32::from(n.pin_expiry != 0),
            "node {id}: pin_ref {} != {pins_below} below + own",
            n.pin_ref
        );
        let locks_below = lock_ref_below.get(&id).copied().unwrap_or(0);
        ensure!(
            n.lock_ref >= locks_below,
            "node {id}: lock_ref {} < {locks_below} below",
            n.lock_ref
        );
    }

    ensure!(
        t.num_evictable_pages == evictable,
        "evictable {} != {evictable}",
        t.num_evictable_pages
    );
    ensure!(
        t.num_locked_pages == locked,
        "locked {} != {locked}",
        t.num_locked_pages
    );
    ensure!(
        t.num_pinned_pages == pinned,
        "pinned {} != {pinned}",
        t.num_pinned_pages
    );
    ensure!(
        t.num_cached_pages == evictable + locked + pinned,
        "cached {} != {}",
        t.num_cached_pages,
        evictable + locked + pinned
    );
    for (&ns, q) in &t.floors {
        let counted = t.namespace_cached_pages(ns);
        ensure!(
            q.cached == counted,
            "quota of namespace {ns}: {} cached pages kept, {counted} counted",
            q.cached
        );
    }
    ensure!(
        t.num_pin_covered_pages == covered,
        "pin-covered {} != {covered}",
        t.num_pin_covered_pages
    );
    ensure!(
        t.pins.len()
            == live
                .iter()
                .filter(|&&i| t.nodes[i as usize].pin_expiry != 0)
                .count(),
        "expiry set holds stale pins"
    );
    ensure!(
        t.next_pin_expiry == t.pins.first().map_or(u64::MAX, |&(e, _, _)| e),
        "stale next_pin_expiry"
    );

    // The index: exactly the nodes flagged in_index; under Lru, descendants before ancestors.
    let order: Vec<NodeId> = t.index.iter().collect();
    let flagged = live
        .iter()
        .filter(|&&i| t.nodes[i as usize].in_index)
        .count();
    ensure!(
        order.len() == flagged && t.index.len() == flagged,
        "index holds {} nodes, {flagged} flagged",
        order.len()
    );
    // (primary, tick) order, ancestors after descendants in it, the front a leaf.
    let position: HashMap<NodeId, usize> =
        order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut last = None;
    for (i, &id) in order.iter().enumerate() {
        let key = t.key_of(id);
        ensure!(
            last <= Some(key),
            "index out of (primary, tick) order at node {id}"
        );
        last = Some(key);
        let parent = t.nodes[id as usize].parent;
        if let Some(&pi) = position.get(&parent) {
            ensure!(pi > i, "index: node {id} after its parent {parent}");
        }
    }
    if let Some(&front) = order.first() {
        ensure!(
            t.nodes[front as usize].num_children == 0,
            "index front {front} is not a leaf"
        );
    }
    Ok(())
}
