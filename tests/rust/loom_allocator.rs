//! loom models of the allocator's races. Run with:
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_allocator`
//! Each model checks, over every interleaving loom explores, that no page is handed out twice and
//! that reference counts and free counts balance at the end.
#![cfg(loom)]

use kvcore::allocator::PageAllocator;
use kvcore::PageId;
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn assert_all_free(a: &PageAllocator) {
    assert_eq!(a.num_free(), a.num_pages() - 1);
    for p in 1..a.num_pages() as PageId {
        assert_eq!(a.ref_count(p).unwrap(), 0, "page {p} still referenced");
    }
}

/// Two threads allocate one page each from one stack: both get one, never the same.
#[test]
fn two_allocations_get_distinct_pages() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let b = a.clone();
        let t = thread::spawn(move || b.allocate(1).unwrap().unwrap()[0]);
        let mine = a.allocate(1).unwrap().unwrap()[0];
        let theirs = t.join().unwrap();
        assert_ne!(mine, theirs);
        a.free(&[mine, theirs]).unwrap();
        assert_all_free(&a);
    });
}

/// On one stack, allocations needing more than is free: exactly one wins, the loser takes nothing.
#[test]
fn racing_allocations_are_all_or_nothing() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let b = a.clone();
        let t = thread::spawn(move || b.allocate(2).unwrap());
        let mine = a.allocate(1).unwrap();
        let theirs = t.join().unwrap();
        assert!(mine.is_some() != theirs.is_some(), "{mine:?} {theirs:?}");
        let held = mine.or(theirs).unwrap();
        assert_eq!(a.num_free(), 2 - held.len());
        a.free(&held).unwrap();
        assert_all_free(&a);
    });
}

/// Two owners of a shared page drop their references at once: exactly one returns it.
#[test]
fn concurrent_frees_of_a_shared_page_balance() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let page = a.allocate(1).unwrap().unwrap();
        a.retain(&page).unwrap();
        let (b, theirs) = (a.clone(), page.clone());
        let t = thread::spawn(move || b.free(&theirs).unwrap());
        a.free(&page).unwrap();
        t.join().unwrap();
        assert_all_free(&a);
    });
}

/// A free races an allocation on the same stack, while a third party retains and frees.
#[test]
fn free_races_allocate_and_retain() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let held = a.allocate(1).unwrap().unwrap();
        a.retain(&held).unwrap();
        let (b, shared) = (a.clone(), held.clone());
        let t = thread::spawn(move || {
            b.free(&shared).unwrap();
        });
        let got = a.allocate(1).unwrap().unwrap();
        assert_ne!(got, held, "a page with a reference was handed out");
        a.free(&held).unwrap();
        t.join().unwrap();
        a.free(&got).unwrap();
        assert_all_free(&a);
    });
}

/// Allocations from different home shards, one of which must take from the other shard.
#[test]
fn cross_shard_allocations_never_duplicate() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(4, 2).unwrap()); // shard 0: [1], shard 1: [2, 3]
        let b = a.clone();
        let t = thread::spawn(move || {
            let mut out = [0; 2];
            b.allocate_into_from(0, &mut out)
                .unwrap()
                .then_some(out.to_vec())
        });
        let mut out = [0; 1];
        let mine = a
            .allocate_into_from(1, &mut out)
            .unwrap()
            .then_some(out.to_vec());
        let theirs = t.join().unwrap();
        let mut all: Vec<PageId> = mine
            .iter()
            .chain(theirs.iter())
            .flatten()
            .copied()
            .collect();
        let total = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), total, "a page was handed out twice");
        assert_eq!(a.num_free(), 3 - total);
        a.free(&all).unwrap();
        assert_all_free(&a);
    });
}

/// A failing `free` races a co-owner's valid `free` of a page it lists: the failure must change
/// nothing, so the page ends with exactly the co-owner's release applied (never free and held).
#[test]
fn failed_free_never_undoes_a_co_owners_release() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(4, 1).unwrap());
        let shared = a.allocate(1).unwrap().unwrap()[0];
        a.retain(&[shared]).unwrap(); // two owners
        let free_page = 3; // never allocated
        let b = a.clone();
        let t = thread::spawn(move || b.free(&[shared]).unwrap());
        assert!(a.free(&[shared, free_page]).is_err());
        t.join().unwrap();
        assert_eq!(a.ref_count(shared).unwrap(), 1);
        assert_eq!(
            a.num_free(),
            2,
            "the shared page must not be on the free list"
        );
        a.free(&[shared]).unwrap();
        assert_all_free(&a);
    });
}

/// The same with a batch that lists the shared page more times than it has references.
#[test]
fn over_listed_free_never_undoes_a_co_owners_release() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(4, 1).unwrap());
        let shared = a.allocate(1).unwrap().unwrap()[0];
        a.retain(&[shared]).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || b.free(&[shared]).unwrap());
        assert!(a.free(&[shared, shared, shared]).is_err());
        t.join().unwrap();
        assert_eq!(a.ref_count(shared).unwrap(), 1);
        assert_eq!(a.num_free(), 2);
        a.free(&[shared]).unwrap();
        assert_all_free(&a);
    });
}

/// Takes every usable page at once: the stack's links and depths must still describe it exactly.
fn assert_stack_intact(a: &PageAllocator) {
    let all = a
        .allocate(a.num_pages() - 1)
        .unwrap()
        .expect("every free page");
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len(), "a page is on the stack twice");
    a.free(&all).unwrap();
    assert_all_free(a);
}

/// A batch of pages held once (`free`'s first loop) is published while another thread moves the
/// head: the publishing CAS fails and the chain is rebuilt on the new head.
#[test]
fn batch_free_races_allocate_and_free() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(5, 1).unwrap());
        let mine = a.allocate(2).unwrap().unwrap();
        let b = a.clone();
        let t = thread::spawn(move || {
            let got = b.allocate(1).unwrap().unwrap();
            b.free(&got).unwrap();
        });
        a.free(&mine).unwrap();
        t.join().unwrap();
        assert_stack_intact(&a);
    });
}

/// `free_serialized` of a batch mixing pages held once and a page held twice (both references
/// this thread's, as the contract requires), racing another thread on the same stack.
#[test]
fn serialized_free_races_other_pages() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(5, 1).unwrap());
        let mine = a.allocate(3).unwrap().unwrap();
        a.retain_serialized(&mine[1..2]).unwrap();
        let b = a.clone();
        let t = thread::spawn(move || {
            let got = b.allocate(1).unwrap().unwrap();
            b.free(&got).unwrap();
        });
        a.free_serialized(&mine).unwrap();
        t.join().unwrap();
        assert_eq!(a.ref_count(mine[1]).unwrap(), 1);
        assert_eq!(a.num_free(), 3);
        a.free_serialized(&mine[1..2]).unwrap();
        assert_stack_intact(&a);
    });
}

/// Two threads free the same sole-owned page at once (a double free racing itself): exactly one
/// succeeds, the other raises, and the page is on the stack once.
#[test]
fn racing_double_free_of_one_page_succeeds_once() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let page = a.allocate(1).unwrap().unwrap()[0];
        let b = a.clone();
        let t = thread::spawn(move || b.free(&[page]).is_ok());
        let mine = a.free(&[page]).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine != theirs, "both or neither succeeded: {mine} {theirs}");
        assert_all_free(&a);
        assert_stack_intact(&a);
    });
}

/// Two threads free the same sole-owned batch at once: they claim its pages in the same order, so
/// exactly one succeeds; the loser gives back every count it took, and each page returns once.
#[test]
fn racing_double_free_of_a_batch_succeeds_once() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let pages = a.allocate(2).unwrap().unwrap();
        let b = a.clone();
        let theirs_pages = pages.clone();
        let t = thread::spawn(move || b.free(&theirs_pages).is_ok());
        let mine = a.free(&pages).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine != theirs, "both or neither succeeded: {mine} {theirs}");
        assert_all_free(&a);
        assert_stack_intact(&a);
    });
}

/// Two frees of one batch listed in opposite orders: they may both raise (each losing a page to
/// the other), never both succeed; a raising call leaves every count as it was, so the pages
/// are then still held once each and a retry frees them.
#[test]
fn crossing_double_frees_never_both_succeed_nor_leak() {
    model(|| {
        let a = Arc::new(PageAllocator::with_shards(3, 1).unwrap());
        let pages = a.allocate(2).unwrap().unwrap();
        let b = a.clone();
        let reversed = vec![pages[1], pages[0]];
        let t = thread::spawn(move || b.free(&reversed).is_ok());
        let mine = a.free(&pages).is_ok();
        let theirs = t.join().unwrap();
        assert!(!(mine && theirs), "both succeeded");
        if !mine && !theirs {
            for &p in &pages {
                assert_eq!(
                    a.ref_count(p).unwrap(),
                    1,
                    "page {p} count changed by failed frees"
                );
            }
            a.free(&pages).unwrap();
        }
        assert_all_free(&a);
        assert_stack_intact(&a);
    });
}
