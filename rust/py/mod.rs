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
// Once finalization starts, a thread that re-attaches to the interpreter is ended by CPython
// 3.11-3.13 with `pthread_exit`, whose forced unwind through our frames aborts the process (exit
// code 134 after a clean script) whenever a daemon thread (a metrics server, a transfer thread) was
// in a kvcore call that detached (long calls, waits for the manager) or ran Python code under our
// frames (a clock, `metrics_text`). So:
// - calls that detach or run Python code are counted ([`active`]); an `atexit` hook
//   ([`wait_for_active_calls`]) marks the exit and waits (detached, at most [`EXIT_WAIT`]) until
//   none is;
// - from then on, another thread that would detach, come back from a detached call, or run Python
//   code for us is held, detached ([`hold_during_exit`]): for good once the interpreter says it is
//   finalizing (it is never ended inside our frames; CPython 3.14 holds such threads the same way),
//   or released after [`HOLD_WAIT`] if finalization has not begun (an `atexit` hook registered
//   before `import kvcore` runs after ours, and may join that very thread);
// - kvcore's result classes (NamedTuples) are built with `tuple.__new__`, which runs no Python
//   code, so the common calls (`page_table`, `take_events`, ...) never let the interpreter switch
//   threads under our frames.
// A counted call raises the counter before it reads the flag, and the hook sets the flag before it
// reads the counter (both `SeqCst`): each call is either waited for or held, free-threaded or not.
// What this cannot cover: the caller's own Python code run inside a call (an `__index__`, a
// generator passed as an argument) while the interpreter finalizes.

/// Calls detached from the interpreter or running Python code for us, now.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that runs the exit (the one `atexit` hooks run in), and when the exit began.
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();
static EXIT_START: OnceLock<Instant> = OnceLock::new();

/// The longest the exit waits for active calls to come back.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// How long after the exit began threads are held if finalization has not begun by then (later
/// `atexit` hooks are running: threads are let go, once, for good).
const HOLD_WAIT: Duration = Duration::from_secs(2);

/// One counted call (see above); dropped once the call is attached again and out of Python code.
pub(crate) struct Active(());

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, SeqCst);
    }
}

/// Whether the interpreter is exiting and this thread is not the one running the exit.
fn exiting_elsewhere() -> bool {
    EXITING.load(SeqCst) && EXIT_THREAD.get() != Some(&std::thread::current().id())
}

/// CPython's own "finalizing" flag (`Py_IsFinalizing`, 3.13+; `_Py_IsFinalizing` before: outside
/// the limited API, so looked up at run time), or None where it cannot be found.
fn interpreter_finalizing() -> Option<bool> {
    type Query = unsafe extern "C" fn() -> std::ffi::c_int;
    static QUERY: OnceLock<Option<Query>> = OnceLock::new();
    let query = QUERY.get_or_init(|| {
        #[cfg(unix)]
        {
            extern "C" {
                fn dlsym(
                    handle: *mut std::ffi::c_void,
                    symbol: *const std::ffi::c_char,
                ) -> *mut std::ffi::c_void;
            }
            // RTLD_DEFAULT: the null handle on Linux, -2 on macOS.
            let handle = if cfg!(target_os = "macos") {
                -2isize as *mut std::ffi::c_void
            } else {
                std::ptr::null_mut()
            };
            for name in [c"Py_IsFinalizing", c"_Py_IsFinalizing"] {
                // SAFETY: dlsym with a valid handle and a NUL-terminated name; a symbol found is
                // CPython's `int (*)(void)` query, callable from any thread (an atomic read).
                let f = unsafe { dlsym(handle, name.as_ptr()) };
                if !f.is_null() {
                    return Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, Query>(f) });
                }
            }
        }
        None
    });
    // SAFETY: see the lookup.
    query.map(|f| unsafe { f() } != 0)
}

/// Hold this thread, detached, through the exit (see above): for good once finalization begins
/// (or when the interpreter cannot say), else until [`HOLD_WAIT`] after the exit began.
fn hold_during_exit() {
    let deadline = *EXIT_START.get_or_init(Instant::now) + HOLD_WAIT;
    loop {
        match interpreter_finalizing() {
            None | Some(true) => loop {
                std::thread::park();
            },
            Some(false) if Instant::now() >= deadline => return,
            Some(false) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Count a call that is about to detach or run Python code (held first if the interpreter is
/// exiting in another thread, see above).
pub(crate) fn active(py: Python<'_>) -> Active {
    if exiting_elsewhere() {
        py.detach(hold_during_exit);
    }
    ACTIVE.fetch_add(1, SeqCst);
    Active(())
}

/// Run `f` detached from the interpreter (other Python threads run meanwhile), counted; a call that
/// comes back while the interpreter is exiting in another thread is held before it re-attaches.
pub(crate) fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    let active = active(py);
    let (out, active) = py.detach(move || {
        let out = f();
        if exiting_elsewhere() {
            drop(active); // held uncounted: the exit does not wait for a held thread
            hold_during_exit();
            return (out, None);
        }
        (out, Some(active)) // dropped once attached again
    });
    drop(active);
    out
}

/// A kvcore NamedTuple `cls(*items)` built by `tuple.__new__`: no Python code runs (see above).
pub(crate) fn new_named_tuple<'py>(
    cls: &Bound<'py, PyAny>,
    items: Bound<'py, pyo3::types::PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    py.get_type::<pyo3::types::PyTuple>()
        .call_method1("__new__", (cls, items))
}

/// The `atexit` hook: mark the exit, then wait for the active calls (see above).
#[pyfunction]
fn wait_for_active_calls(py: Python<'_>) {
    let _ = EXIT_THREAD.set(std::thread::current().id());
    let _ = EXIT_START.set(Instant::now());
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
    let _ = interpreter_finalizing(); // looked up once, here
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
