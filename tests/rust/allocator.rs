//! PageAllocator: unit tests, a proptest action sequence against a trivial model, and a thread stress
//! test. The loom models are in `loom_allocator.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use kvcore::allocator::PageAllocator;
use kvcore::{KvError, PageId};
use proptest::prelude::*;

/// Everything observable about an allocator: free count and every page's count.
fn snapshot(a: &PageAllocator) -> (usize, Vec<u32>) {
    (
        a.num_free(),
        (1..a.num_pages() as PageId)
            .map(|p| a.ref_count(p).unwrap())
            .collect(),
    )
}

#[test]
fn fresh_pool_hands_out_lowest_pages_first() {
    let a = PageAllocator::with_shards(10, 1).unwrap();
    assert_eq!(a.num_free(), 9);
    assert_eq!(a.allocate(3).unwrap(), Some(vec![1, 2, 3]));
    assert_eq!(a.num_free(), 6);
    for p in 1..=3 {
        assert_eq!(a.ref_count(p).unwrap(), 1);
    }
    assert_eq!(a.ref_count(4).unwrap(), 0);
}

#[test]
fn allocation_is_all_or_nothing() {
    for shards in 1..=4 {
        let a = PageAllocator::with_shards(9, shards).unwrap();
        let held = a.allocate(5).unwrap().unwrap();
        let before = snapshot(&a);
        assert_eq!(a.allocate(4).unwrap(), None, "{shards} shards");
        assert_eq!(
            snapshot(&a),
            before,
            "a failed allocation took something ({shards} shards)"
        );
        assert_eq!(a.allocate(3).unwrap().map(|v| v.len()), Some(3));
        a.free(&held).unwrap();
        assert_eq!(a.num_free(), 5);
    }
}

#[test]
fn allocation_steals_across_shards_and_never_duplicates() {
    let a = PageAllocator::with_shards(101, 4).unwrap();
    let all = a.allocate_into_from(2, &mut [0; 100]).unwrap();
    assert!(all);
    let mut out = vec![0; 100];
    a.free(&(1..=100).collect::<Vec<_>>()).unwrap();
    assert!(a.allocate_into_from(3, &mut out).unwrap());
    out.sort_unstable();
    assert_eq!(out, (1..=100).collect::<Vec<_>>());
    assert_eq!(a.num_free(), 0);
}

#[test]
fn zero_pages_is_fine_and_too_many_is_an_error() {
    let a = PageAllocator::new(5).unwrap();
    assert_eq!(a.allocate(0).unwrap(), Some(vec![]));
    assert!(matches!(a.allocate(5), Err(KvError::InvalidArgument(_))));
    assert_eq!(a.num_free(), 4);
    assert!(matches!(
        PageAllocator::new(0),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(PageAllocator::new(1).unwrap().num_free(), 0);
}

#[test]
fn bad_frees_change_nothing() {
    let a = PageAllocator::with_shards(8, 2).unwrap();
    let pages = a.allocate(3).unwrap().unwrap();
    a.retain(&pages[..1]).unwrap(); // pages[0] has 2 references
    let before = snapshot(&a);
    let free_page = 7;
    type Case = (Vec<PageId>, fn(&KvError) -> bool);
    let cases: Vec<Case> = vec![
        (vec![pages[1], 0], |e| matches!(e, KvError::InvalidPage(_))),
        (vec![pages[1], 8], |e| matches!(e, KvError::InvalidPage(_))),
        (vec![pages[1], u32::MAX], |e| {
            matches!(e, KvError::InvalidPage(_))
        }),
        (vec![pages[1], free_page], |e| {
            matches!(e, KvError::DoubleFree(_))
        }),
        (vec![pages[2], pages[1], pages[1]], |e| {
            matches!(e, KvError::DoubleFree(_))
        }),
        (vec![pages[0], pages[0], pages[0]], |e| {
            matches!(e, KvError::DoubleFree(_))
        }),
    ];
    for (batch, is_expected) in cases {
        let err = a.free(&batch).unwrap_err();
        assert!(is_expected(&err), "{batch:?}: {err}");
        assert_eq!(snapshot(&a), before, "free({batch:?}) changed the state");
    }
    // A page listed twice with two references is legal.
    a.free(&[pages[0], pages[0]]).unwrap();
    assert_eq!(a.ref_count(pages[0]).unwrap(), 0);
    assert_eq!(a.num_free(), 5);
}

#[test]
fn bad_retains_change_nothing() {
    for serialized in [false, true] {
        let a = PageAllocator::with_shards(8, 1).unwrap();
        let retain = |pages: &[PageId]| {
            if serialized {
                a.retain_serialized(pages)
            } else {
                a.retain(pages)
            }
        };
        let pages = a.allocate(2).unwrap().unwrap();
        let before = snapshot(&a);
        assert!(matches!(
            retain(&[pages[0], pages[1], 5]),
            Err(KvError::DoubleFree(_))
        ));
        assert!(matches!(
            retain(&[pages[0], 0]),
            Err(KvError::InvalidPage(_))
        ));
        assert_eq!(snapshot(&a), before, "serialized: {serialized}");
        retain(&[pages[0], pages[0], pages[1]]).unwrap();
        assert_eq!(a.ref_count(pages[0]).unwrap(), 3);
    }
    let a = PageAllocator::with_shards(8, 1).unwrap();
    let pages = a.allocate(2).unwrap().unwrap();
    a.retain(&[pages[0], pages[0], pages[1]]).unwrap();
    assert_eq!(a.ref_count(pages[0]).unwrap(), 3);
    assert!(matches!(a.ref_count(8), Err(KvError::InvalidPage(_))));
    assert!(matches!(a.ref_count(0), Err(KvError::InvalidPage(_))));
}

#[derive(Debug, Clone)]
enum Action {
    Allocate(usize),
    Retain(Vec<usize>),
    Free(Vec<usize>),
    FreeUnheld(PageId),
    /// Held pages (shared ones too) followed by an id that is not a page: refused, nothing changed.
    FreeThenBad(Vec<usize>, bool),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (0usize..12).prop_map(Action::Allocate),
        prop::collection::vec(any::<usize>(), 0..4).prop_map(Action::Retain),
        prop::collection::vec(any::<usize>(), 0..6).prop_map(Action::Free),
        (0u32..40).prop_map(Action::FreeUnheld),
        (prop::collection::vec(any::<usize>(), 0..6), any::<bool>())
            .prop_map(|(idx, null)| Action::FreeThenBad(idx, null)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Any action sequence behaves like a map page -> count, and failed calls change nothing; the
    /// same holds through `retain_serialized` / `free_serialized` (`serialized`).
    #[test]
    fn behaves_like_a_counting_model(
        num_pages in 1usize..32, shards in 1usize..5, actions in prop::collection::vec(action(), 1..60),
        serialized in any::<bool>(),
    ) {
        let a = PageAllocator::with_shards(num_pages, shards).unwrap();
        let retain = |pages: &[PageId]| if serialized { a.retain_serialized(pages) } else { a.retain(pages) };
        let free = |pages: &[PageId]| if serialized { a.free_serialized(pages) } else { a.free(pages) };
        let mut model: HashMap<PageId, u32> = HashMap::new(); // held pages -> references
        for act in actions {
            let before = snapshot(&a);
            let held: Vec<PageId> = { let mut h: Vec<_> = model.keys().copied().collect(); h.sort(); h };
            let pick = |idx: &[usize]| -> Vec<PageId> {
                if held.is_empty() { vec![] } else { idx.iter().map(|i| held[i % held.len()]).collect() }
            };
            match act {
                Action::Allocate(n) => {
                    let free = num_pages - 1 - model.len();
                    match a.allocate(n) {
                        Err(_) => prop_assert!(n > num_pages - 1),
                        Ok(None) => { prop_assert!(n > free); prop_assert_eq!(snapshot(&a), before); }
                        Ok(Some(pages)) => {
                            prop_assert!(n <= free);
                            prop_assert_eq!(pages.len(), n);
                            for p in pages { prop_assert!(model.insert(p, 1).is_none(), "page {} handed out twice", p); }
                        }
                    }
                }
                Action::Retain(idx) => {
                    let pages = pick(&idx);
                    retain(&pages).unwrap();
                    for p in pages { *model.get_mut(&p).unwrap() += 1; }
                }
                Action::Free(idx) => {
                    let pages = pick(&idx);
                    let mut want: HashMap<PageId, u32> = HashMap::new();
                    for &p in &pages { *want.entry(p).or_default() += 1; }
                    let legal = want.iter().all(|(p, k)| model[p] >= *k);
                    match free(&pages) {
                        Ok(()) => {
                            prop_assert!(legal);
                            for (p, k) in want {
                                let c = model.get_mut(&p).unwrap();
                                *c -= k;
                                if *c == 0 { model.remove(&p); }
                            }
                        }
                        Err(_) => { prop_assert!(!legal); prop_assert_eq!(snapshot(&a), before); }
                    }
                }
                Action::FreeThenBad(idx, null) => {
                    let mut pages = pick(&idx);
                    pages.push(if null { 0 } else { num_pages as PageId });
                    prop_assert!(free(&pages).is_err());
                    prop_assert_eq!(snapshot(&a), before);
                }
                Action::FreeUnheld(p) => {
                    if !model.contains_key(&p) {
                        prop_assert!(free(&[p]).is_err());
                        prop_assert_eq!(snapshot(&a), before);
                    }
                }
            }
            prop_assert_eq!(a.num_free(), num_pages - 1 - model.len());
            for p in 1..num_pages as PageId {
                prop_assert_eq!(a.ref_count(p).unwrap(), model.get(&p).copied().unwrap_or(0));
            }
        }
    }
}

/// Several threads allocate, share and free at once: no page is ever held by two owners, and every
/// page comes back.
#[test]
fn threads_never_share_a_page_and_every_page_returns() {
    const THREADS: usize = 4;
    const OPS: usize = 20_000;
    let a = Arc::new(PageAllocator::new(257).unwrap());
    let owned: Arc<Vec<AtomicBool>> = Arc::new((0..257).map(|_| AtomicBool::new(false)).collect());
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (a, owned, barrier) = (a.clone(), owned.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut held: Vec<PageId> = Vec::new();
                let mut x = t as u64 + 1;
                for _ in 0..OPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = (x % 17) as usize;
                    if x % 3 != 0 {
                        if let Some(pages) = a.allocate(n).unwrap() {
                            for &p in &pages {
                                assert!(
                                    !owned[p as usize].swap(true, Ordering::SeqCst),
                                    "page {p} held twice"
                                );
                            }
                            // Share then drop the extra reference: counts must balance.
                            a.retain(&pages).unwrap();
                            a.free(&pages).unwrap();
                            held.extend(pages);
                        }
                    } else {
                        let k = n.min(held.len());
                        let gone: Vec<PageId> = held.drain(..k).collect();
                        for &p in &gone {
                            owned[p as usize].store(false, Ordering::SeqCst);
                        }
                        a.free(&gone).unwrap();
                    }
                }
                for &p in &held {
                    owned[p as usize].store(false, Ordering::SeqCst);
                }
                a.free(&held).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(a.num_free(), 256);
    for p in 1..257 {
        assert_eq!(a.ref_count(p).unwrap(), 0);
    }
}

#[test]
fn large_batches_with_duplicates_are_validated_exactly() {
    let a = PageAllocator::with_shards(101, 1).unwrap();
    let pages = a.allocate(40).unwrap().unwrap();
    a.retain(&pages[..1]).unwrap(); // pages[0] has 2 references
    let mut batch = pages.clone();
    batch.push(pages[0]); // listed twice, held twice: legal
    let before = snapshot(&a);
    let mut over = batch.clone();
    over.push(pages[0]); // three times: one too many
    assert!(matches!(a.free(&over), Err(KvError::DoubleFree(_))));
    assert_eq!(snapshot(&a), before);
    a.free(&batch).unwrap();
    assert_eq!(a.num_free(), 100);
}
