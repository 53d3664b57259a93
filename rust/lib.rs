//! kvcore: the core of a KV-cache manager for LLM serving.
//!
//! Pure Rust; the PyO3 bindings live in `rust/py/` behind the `python` feature, so `cargo test` needs no
//! Python. Modules (docs/architecture.md explains the layers and the feature codes):
//! - [`allocator`]: the lock-free page allocator with per-page reference counts (F2).
//! - [`radix`]: the page-granular, ref-counted radix tree for prefix sharing, with namespaces (F3, F4).
//! - [`eviction`]: the eviction index over evictable leaves (LRU, LFU, priority + LRU) (F5).
//! - [`manager`]: the scheduler-facing KV-cache manager: sequences, page tables, copy-on-write.
//! - [`mrc`]: online miss-ratio curves (SHARDS over page keys): hit rate against cache size.
//! - [`keys`]: page keys, the 128-bit identity of a full page's K/V (SHA-256, chained).
//! - [`error`]: the one error type every fallible call returns.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod allocator;
pub mod error;
pub mod eviction;
pub mod keys;
pub mod manager;
pub mod mrc;
pub mod radix;
pub mod remote;
pub(crate) mod shared_copy;
pub(crate) mod sync;

#[cfg(feature = "python")]
mod py;

pub use allocator::PageAllocator;
pub use error::{KvError, KvResult};
pub use manager::{KVCacheManager, ManagerConfig};

/// A page index into the pool. Page 0 is the reserved null page.
pub type PageId = u32;

/// The reserved null page: never handed out, never freed.
pub const NULL_PAGE: PageId = 0;
