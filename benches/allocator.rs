//! Criterion benchmarks of the page allocator, next to a `Mutex<Vec<u32>>` free list measured in the
//! same run. Run: `cargo bench --bench allocator`.
//!
//! `alloc_free/bare_treiber_floor/1` is the cost of one CAS to pop and one to push on a shared stack,
//! with nothing else, the push reusing the head the pop installed. `bare_treiber_separate_calls/1`
//! reloads the head before pushing, as separate `allocate` and `free` calls must: the realistic floor
//! under any lock-free shared free list on this machine.
//!
//! `contention/*/T`: T threads hammer one allocator with allocate(1)+free; one iteration is one
//! allocate+free pair done by *some* thread, so the time per iteration is the inverse of the total
//! throughput (lower is better, comparable across thread counts).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvcore::allocator::PageAllocator;

const POOL: usize = 10_001;

/// The baseline: a free list behind a mutex, as a straightforward engine would write it.
struct MutexFreeList {
    free: Mutex<Vec<u32>>,
}

impl MutexFreeList {
    fn new(num_pages: usize) -> Self {
        Self {
            free: Mutex::new((1..num_pages as u32).rev().collect()),
        }
    }
    fn allocate_into(&self, out: &mut [u32]) -> bool {
        let mut free = self.free.lock().unwrap();
        if free.len() < out.len() {
            return false;
        }
        let at = free.len() - out.len();
        out.copy_from_slice(&free[at..]);
        free.truncate(at);
        true
    }
    fn free(&self, pages: &[u32]) {
        self.free.lock().unwrap().extend_from_slice(pages);
    }
}

/// The floor of any design built on one shared stack: a bare Treiber stack (one CAS to pop, one to
/// push), with no reference counts, no validation and no sharding. Single-threaded use only here.
/// Its push reuses the head its pop just installed, which separate `allocate` and `free` calls
/// cannot do; [`BareTreiberSeparateCalls`] reloads it, as any real `free` must.
struct BareTreiber {
    head: AtomicU64,
    next: Vec<AtomicU64>,
}

/// The same stack, with the push reading the head afresh (a `free` does not know what the last
/// `allocate` saw): the floor for separate calls.
struct BareTreiberSeparateCalls(BareTreiber);

impl BareTreiber {
    fn new(num_pages: usize) -> Self {
        let next = (0..num_pages)
            .map(|i| AtomicU64::new(if i + 1 < num_pages { i as u64 + 1 } else { 0 }))
            .collect();
        Self {
            head: AtomicU64::new(1),
            next,
        }
    }
}

trait Pool: Send + Sync + 'static {
    fn alloc_free(&self, out: &mut [u32]);
}

impl Pool for PageAllocator {
    #[inline]
    fn alloc_free(&self, out: &mut [u32]) {
        assert!(self.allocate_into(out).unwrap());
        self.free(out).unwrap();
    }
}

impl Pool for BareTreiber {
    #[inline]
    fn alloc_free(&self, out: &mut [u32]) {
        let head = self.head.load(Ordering::Acquire);
        let top = head & 0xFFFF_FFFF;
        let next = self.next[top as usize].load(Ordering::Relaxed);
        let popped = ((head >> 32) + 1) << 32 | next;
        assert!(self
            .head
            .compare_exchange(head, popped, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
        out[0] = top as u32;
        self.next[top as usize].store(next, Ordering::Relaxed);
        let pushed = ((popped >> 32) + 1) << 32 | top;
        assert!(self
            .head
            .compare_exchange(popped, pushed, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
    }
}

impl Pool for BareTreiberSeparateCalls {
    #[inline]
    fn alloc_free(&self, out: &mut [u32]) {
        let t = &self.0;
        let head = t.head.load(Ordering::Acquire);
        let top = head & 0xFFFF_FFFF;
        let next = t.next[top as usize].load(Ordering::Relaxed);
        let popped = ((head >> 32) + 1) << 32 | next;
        assert!(t
            .head
            .compare_exchange(head, popped, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
        out[0] = top as u32;
        let now = t.head.load(Ordering::Acquire);
        t.next[top as usize].store(now & 0xFFFF_FFFF, Ordering::Relaxed);
        let pushed = ((now >> 32) + 1) << 32 | top;
        assert!(t
            .head
            .compare_exchange(now, pushed, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
    }
}

impl Pool for MutexFreeList {
    #[inline]
    fn alloc_free(&self, out: &mut [u32]) {
        assert!(self.allocate_into(out));
        self.free(out);
    }
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free");
    for n in [1usize, 64] {
        let a = PageAllocator::new(POOL).unwrap();
        let mut out = vec![0u32; n];
        group.bench_with_input(BenchmarkId::new("kvcore", n), &n, |b, _| {
            b.iter(|| a.alloc_free(black_box(&mut out)))
        });
        let m = MutexFreeList::new(POOL);
        group.bench_with_input(BenchmarkId::new("mutex_vec", n), &n, |b, _| {
            b.iter(|| m.alloc_free(black_box(&mut out)))
        });
        if n == 1 {
            let t = BareTreiber::new(POOL);
            group.bench_with_input(BenchmarkId::new("bare_treiber_floor", n), &n, |b, _| {
                b.iter(|| t.alloc_free(black_box(&mut out)))
            });
            let s = BareTreiberSeparateCalls(BareTreiber::new(POOL));
            group.bench_with_input(
                BenchmarkId::new("bare_treiber_separate_calls", n),
                &n,
                |b, _| b.iter(|| s.alloc_free(black_box(&mut out))),
            );
        }
    }
    group.finish();
}

/// `threads` threads share `pool`; together they do `iters` allocate(1)+free pairs.
fn hammer<P: Pool>(pool: &Arc<P>, threads: usize, iters: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let per_thread = iters.div_ceil(threads as u64);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut out = [0u32; 1];
                barrier.wait();
                for _ in 0..per_thread {
                    pool.alloc_free(black_box(&mut out));
                }
                barrier.wait();
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    barrier.wait();
    let elapsed = start.elapsed();
    for h in handles {
        h.join().unwrap();
    }
    elapsed
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("contention");
    for threads in [1usize, 2, 4] {
        let a = Arc::new(PageAllocator::new(POOL).unwrap());
        group.bench_with_input(BenchmarkId::new("kvcore", threads), &threads, |b, &t| {
            b.iter_custom(|iters| hammer(&a, t, iters))
        });
        let m = Arc::new(MutexFreeList::new(POOL));
        group.bench_with_input(BenchmarkId::new("mutex_vec", threads), &threads, |b, &t| {
            b.iter_custom(|iters| hammer(&m, t, iters))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = single_thread, contention
}
criterion_main!(benches);
