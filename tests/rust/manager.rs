//! KVCacheManager against a model, by proptest: random admissions (with reservations), appends
//! (with lookahead), truncations, forks, commits, frees, evictions, inserts and resets. After
//! every action the manager's books must balance against what the model knows: each page's
//! reference count equals its owners (tree, sequences, queued copies, caller), page tables cover
//! exactly the reserved tokens, the usage split sums to the pool, and a refusal changes nothing.

use std::collections::{HashMap, HashSet};

use kvcore::eviction::EvictionPolicy;
use kvcore::keys::PageKey;
use kvcore::manager::{KVCacheManager, KvEvent, ManagerConfig, SeqId};
use kvcore::PageId;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Add {
        tokens: Vec<u32>,
        ns: u8,
        cache: bool,
        reserve: Option<usize>,
    },
    Reserve {
        seq: usize,
        n: usize,
    },
    Append {
        seq: usize,
        tokens: Vec<u32>,
        lookahead: usize,
    },
    Truncate {
        seq: usize,
        keep: usize,
    },
    Fork {
        seq: usize,
    },
    Commit {
        seq: usize,
        n: usize,
    },
    Free {
        seq: usize,
    },
    Evict {
        n: usize,
    },
    Insert {
        tokens: Vec<u32>,
        ns: u8,
    },
    TakeCopies,
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let toks = || prop::collection::vec(0u32..3, 1..12);
    prop_oneof![
        3 => (toks(), 0u8..3, any::<bool>(), prop::option::of(0usize..12))
            .prop_map(|(tokens, ns, cache, reserve)| Op::Add { tokens, ns, cache, reserve }),
        1 => (any::<usize>(), 0usize..8).prop_map(|(seq, n)| Op::Reserve { seq, n }),
        3 => (any::<usize>(), prop::collection::vec(0u32..3, 0..5), 0usize..3)
            .prop_map(|(seq, tokens, lookahead)| Op::Append { seq, tokens, lookahead }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(seq, keep)| Op::Truncate { seq, keep }),
        2 => any::<usize>().prop_map(|seq| Op::Fork { seq }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(seq, n)| Op::Commit { seq, n }),
        2 => any::<usize>().prop_map(|seq| Op::Free { seq }),
        1 => (0usize..6).prop_map(|n| Op::Evict { n }),
        1 => (prop::collection::vec(0u32..3, 1..12), 0u8..3).prop_map(|(tokens, ns)| Op::Insert { tokens, ns }),
        1 => Just(Op::TakeCopies),
        1 => Just(Op::Reset),
    ]
}

/// What the model knows of one live sequence.
#[derive(Clone, Debug)]
struct Model {
    len: usize,
    slots: usize,
    manual: bool,
    committed: usize,
}

fn ns_name(ns: u8) -> Option<&'static str> {
    [None, Some("a"), Some("*")][ns as usize % 3]
}

/// Everything observable that a refusal must leave as it was.
fn snapshot(m: &KVCacheManager, ids: &[SeqId]) -> (Vec<u32>, Vec<Vec<PageId>>, Vec<PageId>) {
    let refs = (1..m.num_pages() as PageId)
        .map(|p| m.ref_count(p).unwrap())
        .collect();
    let pages = ids.iter().map(|&id| m.seq_pages(id).unwrap()).collect();
    let mut cached = m.cached_pages();
    cached.sort_unstable();
    (refs, pages, cached)
}

fn check(m: &KVCacheManager, seqs: &HashMap<SeqId, Model>, copies: &[(PageId, PageId)], ps: usize) {
    let mut owners: HashMap<PageId, u32> = HashMap::new();
    for p in m.cached_pages() {
        *owners.entry(p).or_default() += 1;
    }
    for (&id, model) in seqs {
        let pages = m.seq_pages(id).unwrap();
        assert_eq!(m.seq_len(id).unwrap(), model.len, "sequence {id} length");
        assert_eq!(
            m.num_reserved(id).unwrap(),
            model.slots,
            "sequence {id} slots"
        );
        assert_eq!(pages.len(), model.slots.div_ceil(ps), "sequence {id} pages");
        for p in pages {
            *owners.entry(p).or_default() += 1;
        }
        if model.slots > 0 {
            let t = m.page_table(&[id], None, 0, false).unwrap();
            assert_eq!(t.kv_indices.len(), model.slots.div_ceil(ps));
            assert_eq!(
                t.kv_last_page_len[0] as usize,
                model.slots - (model.slots.div_ceil(ps) - 1) * ps
            );
        }
    }
    // Pending copies not taken yet (this model takes them only on TakeCopies) hold their sources.
    let _ = copies;
    for p in m.caller_held_pages() {
        *owners.entry(p).or_default() += 1;
    }
    let mut free = 0;
    for p in 1..m.num_pages() as PageId {
        let refs = m.ref_count(p).unwrap();
        let want = owners.get(&p).copied().unwrap_or(0);
        // Beyond its owners a page can only be held as the source of queued copies.
        assert!(refs >= want, "page {p}: {refs} references, {want} owners");
        free += usize::from(refs == 0);
    }
    let s = m.stats(0);
    assert_eq!(s.num_pages_free, free);
    assert_eq!(
        s.num_pages_in_use + s.num_pages_cached + s.num_pages_pinned + s.num_pages_free,
        s.num_pages_total
    );
    assert_eq!(s.num_sequences, seqs.len());
}

/// Replay the events into `index`; it must hold exactly the cached pages, and every live sequence's
/// cached full pages under the keys `page_keys` gives them.
fn route(
    m: &KVCacheManager,
    index: &mut HashMap<PageKey, PageId>,
    seqs: &HashMap<SeqId, Model>,
    ps: usize,
) {
    for event in m.take_events() {
        match event {
            KvEvent::Stored {
                keys,
                parent,
                pages,
                ..
            } => {
                assert_eq!(keys.len(), pages.len());
                if let Some(parent) = parent {
                    assert!(
                        index.contains_key(&parent),
                        "a stored page's parent is not indexed"
                    );
                }
                for (k, p) in keys.into_iter().zip(pages) {
                    assert!(index.insert(k, p).is_none(), "a key stored twice");
                }
            }
            KvEvent::Removed { keys, pages, .. } => {
                assert_eq!(keys.len(), pages.len());
                for (k, p) in keys.into_iter().zip(pages) {
                    assert_eq!(index.remove(&k), Some(p), "a removed key was not indexed");
                }
            }
            KvEvent::AllCleared { .. } => index.clear(),
        }
    }
    let mut indexed: Vec<PageId> = index.values().copied().collect();
    indexed.sort_unstable();
    let mut cached = m.cached_pages();
    cached.sort_unstable();
    assert_eq!(
        indexed, cached,
        "the router's index disagrees with the tree"
    );
    let tree: HashSet<PageId> = cached.into_iter().collect();
    for &id in seqs.keys() {
        let keys = m.page_keys(id).unwrap();
        let pages = m.seq_pages(id).unwrap();
        for (i, key) in keys.iter().enumerate().take(pages.len()) {
            if tree.contains(&pages[i]) {
                assert_eq!(
                    index.get(key),
                    Some(&pages[i]),
                    "sequence {id} page {i}: key not routed"
                );
            }
        }
        let _ = ps;
    }
}

fn pick(seqs: &HashMap<SeqId, Model>, i: usize) -> Option<SeqId> {
    let mut ids: Vec<SeqId> = seqs.keys().copied().collect();
    ids.sort_unstable();
    (!ids.is_empty()).then(|| ids[i % ids.len()])
}

fn run(ops: Vec<Op>, num_pages: usize, ps: usize) {
    let m = KVCacheManager::new(ManagerConfig {
        num_pages,
        page_size: ps,
        policy: EvictionPolicy::Lru,
        pin_budget_pages: None,
        fingerprint: Vec::new(),
        events: true,
        lower_tiers: Vec::new(),
        store_policy: Default::default(),
        groups: Vec::new(),
    })
    .unwrap();
    let mut seqs: HashMap<SeqId, Model> = HashMap::new();
    let mut next: SeqId = 0;
    let mut taken: Vec<(PageId, PageId)> = Vec::new();
    // A router's index, built from the events alone.
    let mut index: HashMap<PageKey, PageId> = HashMap::new();
    for op in ops {
        let ids: Vec<SeqId> = {
            let mut v: Vec<SeqId> = seqs.keys().copied().collect();
            v.sort_unstable();
            v
        };
        let before = snapshot(&m, &ids);
        match op {
            Op::Add {
                tokens,
                ns,
                cache,
                reserve,
            } => {
                next += 1;
                let len = tokens.len();
                match m
                    .add_sequence_with(next, tokens, ns_name(ns), 0, cache, reserve, None, 0)
                    .unwrap()
                {
                    Some(hit) => {
                        let slots = reserve.map_or(len, |r| hit + r.min(len - hit));
                        seqs.insert(
                            next,
                            Model {
                                len,
                                slots,
                                manual: !cache,
                                committed: hit,
                            },
                        );
                    }
                    None => assert_eq!(
                        snapshot(&m, &ids),
                        before,
                        "a refused admission changed things"
                    ),
                }
            }
            Op::Reserve { seq, n } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                let model = seqs.get_mut(&id).unwrap();
                match m.reserve(id, n, 0) {
                    Ok(true) => model.slots += n,
                    Ok(false) => assert_eq!(snapshot(&m, &ids), before),
                    Err(_) => {
                        assert!(n > model.len.saturating_sub(model.slots));
                        assert_eq!(snapshot(&m, &ids), before);
                    }
                }
            }
            Op::Append {
                seq,
                tokens,
                lookahead,
            } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                let model = seqs.get_mut(&id).unwrap();
                match m.append_with_lookahead(id, &tokens, lookahead, 0) {
                    Ok(true) => {
                        // Each append keeps exactly its own draft slots: an earlier call's go.
                        model.len += tokens.len();
                        model.slots = model.len + lookahead;
                    }
                    Ok(false) => assert_eq!(snapshot(&m, &ids), before),
                    Err(_) => {
                        assert!(model.slots < model.len);
                        assert_eq!(snapshot(&m, &ids), before);
                    }
                }
            }
            Op::Truncate { seq, keep } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                let model = seqs.get_mut(&id).unwrap();
                let n = 1 + keep % model.len;
                m.truncate(id, n).unwrap();
                model.len = n;
                model.slots = model.slots.min(n);
                model.committed = model.committed.min(n);
            }
            Op::Fork { seq } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                let model = seqs[&id].clone();
                next += 1;
                let computed =
                    model.slots >= model.len && (!model.manual || model.committed >= model.len);
                match m.fork(id, next) {
                    Ok(()) => {
                        assert!(computed);
                        seqs.insert(next, model);
                    }
                    Err(_) => {
                        assert!(!computed);
                        assert_eq!(snapshot(&m, &ids), before);
                    }
                }
            }
            Op::Commit { seq, n } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                let model = seqs.get_mut(&id).unwrap();
                let n = n % (model.slots.min(model.len) + 1);
                m.commit(id, n, 0).unwrap();
                model.committed = model.committed.max(n);
            }
            Op::Free { seq } => {
                let Some(id) = pick(&seqs, seq) else { continue };
                m.free_sequence(id).unwrap();
                seqs.remove(&id);
            }
            Op::Evict { n } => {
                let cached = m.stats(0).num_pages_cached;
                assert_eq!(m.evict(n, 0).unwrap(), n.min(cached));
            }
            Op::Insert { tokens, ns } => {
                let k = tokens.len() / ps;
                if k == 0 || k > num_pages - 1 {
                    continue;
                }
                if let Some(pages) = m.allocate_pages(k, 0).unwrap() {
                    let adopted = m.insert(&tokens[..k * ps], &pages, ns_name(ns), 0).unwrap();
                    m.free_pages(&pages[..k - adopted]).unwrap();
                }
            }
            Op::TakeCopies => {
                let pairs = m.take_pending_copies().unwrap();
                let dst: HashSet<PageId> = pairs.iter().map(|&(_, d)| d).collect();
                assert_eq!(dst.len(), pairs.len(), "a destination twice");
                assert!(
                    pairs.iter().all(|(s, _)| !dst.contains(s)),
                    "a destination is a source"
                );
                taken = pairs;
            }
            Op::Reset => {
                let s = m.stats(0);
                assert_eq!(
                    m.reset_prefix_cache(0).unwrap(),
                    s.num_pages_cached + s.num_pages_pinned
                );
            }
        }
        check(&m, &seqs, &taken, ps);
        route(&m, &mut index, &seqs, ps);
    }
    // Everything comes back once every sequence is freed and the copies are taken.
    for id in seqs.keys().copied().collect::<Vec<_>>() {
        m.free_sequence(id).unwrap();
    }
    m.take_pending_copies().unwrap();
    m.reset_prefix_cache(0).unwrap();
    let s = m.stats(0);
    assert_eq!(s.num_pages_free, s.num_pages_total, "pages leaked: {s:?}");
}

proptest! {
    // PROPTEST_CASES=20000 for a longer hunt (CI runs 400).
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
    ))]
    #[test]
    fn the_manager_keeps_its_books_against_a_model(
        ops in prop::collection::vec(op(), 1..100),
        num_pages in 4usize..40,
        ps in 1usize..5,
    ) {
        run(ops, num_pages, ps);
    }
}

/// `append_batch` appends in order and stops at the first sequence without room: the same state as
/// the appends one by one up to it, and nothing changed for a bad or repeated id.
#[test]
fn append_batch_is_appends_in_order_up_to_the_first_without_room() {
    let config = |num_pages| ManagerConfig {
        num_pages,
        page_size: 2,
        policy: EvictionPolicy::Lru,
        pin_budget_pages: None,
        fingerprint: Vec::new(),
        events: false,
        lower_tiers: Vec::new(),
        store_policy: Default::default(),
        groups: Vec::new(),
    };
    let (a, b) = (
        KVCacheManager::new(config(8)).unwrap(),
        KVCacheManager::new(config(8)).unwrap(),
    );
    for m in [&a, &b] {
        for id in 0..3 {
            m.add_sequence(id, vec![id as u32 + 1, 9], None, 0, true, 0)
                .unwrap();
        }
    }
    // 7 usable pages, 3 held: a page each for the first... until the pool runs dry.
    let mut appended = 0;
    for round in 0..3u32 {
        let got = a
            .append_batch(&[0, 1, 2], &[round, round, round], 0)
            .unwrap();
        let mut want = 0;
        for id in 0..3 {
            if !b.append(id, &[round], 0).unwrap() {
                break;
            }
            want += 1;
        }
        assert_eq!(got, want);
        appended += got;
        for id in 0..3 {
            assert_eq!(a.seq_len(id).unwrap(), b.seq_len(id).unwrap());
            assert_eq!(a.seq_pages(id).unwrap(), b.seq_pages(id).unwrap());
        }
    }
    assert!(appended < 9, "the pool must have run dry");
    let before: Vec<_> = (0..3).map(|id| a.seq_len(id).unwrap()).collect();
    assert!(a.append_batch(&[0, 0], &[1, 1], 0).is_err());
    assert!(a.append_batch(&[0, 7], &[1, 1], 0).is_err());
    assert!(a.append_batch(&[0], &[1, 1], 0).is_err());
    let after: Vec<_> = (0..3).map(|id| a.seq_len(id).unwrap()).collect();
    assert_eq!(before, after);
}
