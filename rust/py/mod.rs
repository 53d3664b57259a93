//! PyO3 bindings: convert arguments, call the core, convert back. Nothing else lives here.
//!
//! No panic may cross into Python: `unwrap`/`expect` are denied, and every core error becomes an
//! exception of the `kvcore.exceptions` hierarchy through one `From<KvError> for PyErr` (`error`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod allocator;
mod convert;
mod error;
mod manager;
mod remote;
mod tiers;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

// # Daemon threads at interpreter exit
// Once finalization starts, a thread that re-attaches to the interpreter (after a detached call, or
// when Python code we called lets the interpreter switch threads) is ended by CPython 3.11-3.13 with
// `pthread_exit`, whose forced unwind through our frames aborts the process: exit code 134 after a
// clean script, whenever a daemon thread (a metrics server, a transfer thread) was in a kvcore call.
// So an `atexit` hook ([`wait_for_active_calls`]) marks the exit, waits (detached, at most
// [`EXIT_WAIT`]) until no call is detached or running Python code for us, and from then on any other
// thread that would detach or call Python from our code parks, detached, for good (as CPython 3.14
// makes such threads hang): it is never ended inside our frames. The exiting thread itself (module
// teardown, `__del__`) runs as usual. A counted call raises the counter before it reads the flag, and
// the hook sets the flag before it reads the counter (both `SeqCst`): a call is either waited for or
// parks, free-threaded or not.

/// Calls detached from the interpreter or running Python code for us, now.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that runs the exit (the one `atexit` hooks run in).
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// The longest the exit waits for active calls to come back.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// One counted call (see above); dropped once the call is attached again and out of Python code.
pub(crate) struct Active(());

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, SeqCst);
    }
}

/// Count a call that is about to detach or run Python code; parks the thread for good when the
/// interpreter is exiting and this is not the exiting thread.
pub(crate) fn active(py: Python<'_>) -> Active {
    ACTIVE.fetch_add(1, SeqCst);
    let active = Active(());
    if EXITING.load(SeqCst) && EXIT_THREAD.get() != Some(&std::thread::current().id()) {
        drop(active);
        park_for_good(py);
    }
    active
}

/// Detach and never come back (the interpreter is exiting in another thread).
fn park_for_good(py: Python<'_>) -> ! {
    py.detach(|| loop {
        std::thread::park();
    })
}

/// Run `f` detached from the interpreter (other Python threads run meanwhile), counted.
pub(crate) fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    let _active = active(py);
    py.detach(f)
}

/// The `atexit` hook: mark the exit, then wait for the active calls (see above).
#[pyfunction]
fn wait_for_active_calls(py: Python<'_>) {
    let _ = EXIT_THREAD.set(std::thread::current().id());
    EXITING.store(true, SeqCst);
    let deadline = Instant::now() + EXIT_WAIT;
    py.detach(|| {
        while ACTIVE.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    });
}

/// The private native module `kvcore._kvcore`; the public API is re-exported by `kvcore/__init__.py`.
#[pymodule(gil_used = false)]
fn _kvcore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::init(m.py())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_EVENTS", crate::manager::MAX_EVENTS)?;
    m.add_class::<crate::manager::CacheStats>()?;
    m.add_class::<allocator::PyPageAllocator>()?;
    m.add_class::<manager::PyKVCacheManager>()?;
    m.add_class::<remote::PyRespClient>()?;
    m.add_function(wrap_pyfunction!(manager::py_page_keys, m)?)?;
    m.add_function(wrap_pyfunction!(manager::py_payload_checksum, m)?)?;
    m.add_function(wrap_pyfunction!(manager::py_cache_stats, m)?)?;
    let hook = wrap_pyfunction!(wait_for_active_calls, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
