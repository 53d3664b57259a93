//! Bindings of [`crate::manager::KVCacheManager`] as `kvcore.KVCacheManager`.
//!
//! Every argument is converted (and arrays copied) by `convert` *before* the manager's clock is
//! read, and the clock is read before the core call: no Python code runs while the core holds its
//! lock or while anything points into a caller's array.

use std::time::Instant;

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice, PyTuple};

use super::convert::{
    bool_arg, bytes_arg, count_arg, counts_arg, float_arg, floats_arg, int_arg, int_value,
    iter_arg, namespace_arg, opt_arg, page_arg, page_ids, seq_ids_arg, str_arg, tokens, Arg,
};
use crate::error::KvError;
use crate::eviction::EvictionPolicy;
use crate::manager::{CacheStats, KVCacheManager, KvEvent, ManagerConfig, SeqId};

static PAGE_TABLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static BATCH_LAYOUT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PREFIX_MATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PREFIX_HIT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static GROUP_WINDOWS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static MISS_RATIO_CURVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `groups=`: a list of windows (`None` for full attention, an int of tokens for a window).
fn groups_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Option<usize>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let bad = || {
        PyErr::from(KvError::InvalidArgument(
            "groups must be a list of windows: None (full attention) or an int >= 1 (tokens)"
                .into(),
        ))
    };
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(bad());
    }
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| bad())? {
        let item = item?;
        out.push(if item.is_none() {
            None
        } else {
            Some(count_arg(&item, "groups[i]")?)
        });
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// An optional count argument (`None` when absent or None).
fn opt_count(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<usize>> {
    opt_arg(obj, |o| count_arg(o, name))
}
static PAGE_STORED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static PAGE_REMOVED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static ALL_CLEARED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static METRICS_TEXT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static TRANSFER_BATCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn python_attr<'py>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<PyAny>>,
    module: &str,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(cell
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import(module)?.getattr(name)?.unbind())
        })?
        .bind(py)
        .clone())
}

/// `module.name(*items)` for a kvcore NamedTuple class, built without running Python code (see
/// `super::new_named_tuple`).
fn tuple_attr<'py, A>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<PyAny>>,
    module: &str,
    name: &str,
    items: A,
) -> PyResult<Bound<'py, PyAny>>
where
    A: IntoPyObject<'py, Target = PyTuple, Output = Bound<'py, PyTuple>>,
    PyErr: From<A::Error>,
{
    let cls = python_attr(py, cell, module, name)?;
    super::new_named_tuple(&cls, items.into_pyobject(py)?)
}

/// Call `module.name(*args)`, a kvcore function written in Python, as a counted call (Python code
/// runs under our frames: see `super::active`).
fn call_attr<'py>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<PyAny>>,
    module: &str,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let callee = python_attr(py, cell, module, name)?;
    let _active = super::active(py);
    callee.call1(args)
}

/// Calls whose work grows past these (tokens, pages, sequences in a batch) run detached from the
/// interpreter: other Python threads keep running meanwhile (a transfer-completion thread is not
/// stalled by the scheduler's large evictions, resets or tables).
/// Pages a miss-ratio curve tracks with `miss_ratio_curve=True` (about 0.5 MB).
const DEFAULT_MRC_SAMPLES: usize = 8192;
/// The most pages a miss-ratio curve may track (about 250 MB).
const MAX_MRC_SAMPLES: usize = 1 << 22;

/// `miss_ratio_curve=`: `None`/`False` (off), `True` (the default bound) or a number of pages.
fn mrc_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(bool_arg(obj, "miss_ratio_curve")?.then_some(DEFAULT_MRC_SAMPLES));
    }
    let n = count_arg(obj, "miss_ratio_curve")?;
    if !(1..=MAX_MRC_SAMPLES).contains(&n) {
        return Err(KvError::InvalidArgument(format!(
            "miss_ratio_curve must be True, False or the number of pages to sample, in \
             1..={MAX_MRC_SAMPLES}, got {n}"
        ))
        .into());
    }
    Ok(Some(n))
}

const LONG_TOKENS: usize = 8192;
const LONG_PAGES: usize = 1024;
const LONG_BATCH: usize = 64;

/// The arguments of a prefix lookup: the token ids (copied) and the namespace.
fn lookup_args(
    tokens: &Bound<'_, PyAny>,
    namespace: Option<&Bound<'_, PyAny>>,
) -> PyResult<(super::convert::Ids, Option<String>)> {
    Ok((self::tokens(tokens)?, namespace_arg(namespace)?))
}

fn seq_id(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<SeqId> {
    int_value(obj, name)
}

/// The KV-cache manager an engine's scheduler talks to every step (see docs/api.md).
#[pyclass(name = "KVCacheManager", module = "kvcore._kvcore", frozen)]
pub(crate) struct PyKVCacheManager {
    inner: KVCacheManager,
    /// Every call into `inner` passes this gate (see [`Self::run`]): attached, it is only ever
    /// tried, never waited for, so no thread waits on the manager while holding the interpreter.
    gate: parking_lot::Mutex<()>,
    /// Injected clock (seconds, float) for TTL tests; None: a monotonic clock.
    clock: Option<Py<PyAny>>,
    epoch: Instant,
    /// The lower tiers' names (fixed at construction).
    tier_names: Vec<String>,
}

impl PyKVCacheManager {
    /// Run `f` on the core through the gate. A short call takes the gate without waiting and runs
    /// attached (no cost beyond an uncontended lock); a `long` one, or one that finds the gate
    /// taken (another thread's call, possibly a long detached one), releases the interpreter,
    /// waits for the gate and runs detached. So a thread never blocks on the manager while
    /// attached (polars' rule): whatever waits, other Python threads keep running.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        long: bool,
        f: impl FnOnce(&KVCacheManager) -> R + Send,
    ) -> R {
        if !long {
            if let Some(_gate) = self.gate.try_lock() {
                return f(&self.inner);
            }
        }
        super::detach(py, || {
            let _gate = self.gate.lock();
            f(&self.inner)
        })
    }

    /// [`run`](Self::run) for a call whose cost grows with sequence `id`'s length (free, truncate,
    /// fork): detached when the sequence holds `LONG_TOKENS` tokens or more. Its length is read
    /// through the gate; a race that changes it only changes where the call runs.
    fn run_for_seq<R: Send>(
        &self,
        py: Python<'_>,
        id: i64,
        f: impl FnOnce(&KVCacheManager) -> R + Send,
    ) -> R {
        if let Some(_gate) = self.gate.try_lock() {
            if self.inner.seq_len(id).map_or(true, |n| n < LONG_TOKENS) {
                return f(&self.inner);
            }
        }
        super::detach(py, || {
            let _gate = self.gate.lock();
            f(&self.inner)
        })
    }

    /// A side-effect-free prefix lookup: `tokens` (copied) and `namespace` converted, then `f` run
    /// through the gate (detached for long prompts).
    fn run_lookup<R: Send>(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        f: impl FnOnce(&KVCacheManager, &[u32], Option<&str>) -> R + Send,
    ) -> PyResult<R> {
        let (ids, namespace) = lookup_args(tokens, namespace)?;
        Ok(self.run(py, ids.as_slice().len() >= LONG_TOKENS, |m| {
            f(m, ids.as_slice(), namespace.as_deref())
        }))
    }

    /// Microseconds on the manager's clock. Calls the injected clock (Python code): callers do it
    /// after converting their arguments and before the core call.
    fn now(&self, py: Python<'_>) -> PyResult<u64> {
        match &self.clock {
            None => Ok(self.epoch.elapsed().as_micros() as u64),
            Some(clock) => {
                let value = {
                    let _active = super::active(py);
                    clock.bind(py).call0()?
                };
                let seconds = float_arg(&value, "the clock's return value")?;
                seconds_to_micros(seconds, "the clock's return value")
            }
        }
    }
}

/// A `sink=` argument: None, or a list (anything else: `InvalidArgumentError`).
fn list_sink<'a, 'py>(
    sink: Option<&'a Bound<'py, PyAny>>,
    what: &str,
) -> PyResult<Option<&'a Bound<'py, PyList>>> {
    match sink.filter(|s| !s.is_none()) {
        None => Ok(None),
        Some(s) => Ok(Some(s.cast::<PyList>().map_err(|_| {
            KvError::InvalidArgument(format!(
                "{what}: sink must be a list, got {}",
                s.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?)),
    }
}

/// One KV event as its `kvcore.events` NamedTuple.
fn event_object<'py>(py: Python<'py>, event: &KvEvent) -> PyResult<Bound<'py, PyAny>> {
    let key_list = |keys: &[crate::keys::PageKey]| -> Vec<Bound<'py, PyBytes>> {
        keys.iter().map(|k| PyBytes::new(py, k)).collect()
    };
    let page_array = |pages: &[crate::PageId]| {
        PyArray1::from_vec(py, pages.iter().map(|&p| p as i32).collect::<Vec<i32>>())
    };
    match event {
        KvEvent::Stored {
            keys,
            parent,
            namespace,
            pages,
            medium,
            tokens,
        } => tuple_attr(
            py,
            &PAGE_STORED,
            "kvcore.events",
            "PageStored",
            (
                key_list(keys),
                parent.map(|k| PyBytes::new(py, &k)),
                namespace.as_deref(),
                medium.as_str(),
                page_array(pages),
                PyArray1::from_slice(py, tokens),
            ),
        ),
        KvEvent::Removed {
            keys,
            pages,
            medium,
        } => tuple_attr(
            py,
            &PAGE_REMOVED,
            "kvcore.events",
            "PageRemoved",
            (key_list(keys), medium.as_str(), page_array(pages)),
        ),
        KvEvent::AllCleared { medium } => tuple_attr(
            py,
            &ALL_CLEARED,
            "kvcore.events",
            "AllCleared",
            (medium.as_str(),),
        ),
    }
}

/// `{"hbm": hit[0], tier name: hit[1 + t], ...}`.
fn hit_dict<'py>(py: Python<'py>, names: &[String], hit: &[usize]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("hbm", hit[0])?;
    for (name, n) in names.iter().zip(&hit[1..]) {
        d.set_item(name, n)?;
    }
    Ok(d)
}

fn seconds_to_micros(seconds: f64, name: &str) -> PyResult<u64> {
    // Beyond 2**63 microseconds (292,000 years) is not a time either.
    if !seconds.is_finite() || !(0.0..9.2e12).contains(&seconds) {
        return Err(KvError::InvalidArgument(format!(
            "{name} must be a finite number of seconds in [0, 9.2e12], got {seconds}"
        ))
        .into());
    }
    Ok((seconds * 1e6) as u64)
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(
        signature = (num_pages, page_size = None, eviction = Arg::Missing, *, pin_budget_pages = None, clock = None, fingerprint = None, events = None, lower_tiers = None, store_policy = None, store_options = None, groups = None, miss_ratio_curve = None),
        text_signature = "(num_pages, page_size=None, eviction='lru', *, pin_budget_pages=None, clock=None, fingerprint=None, events=False, lower_tiers=None, store_policy='selective', store_options=None, groups=None, miss_ratio_curve=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_pages: &Bound<'_, PyAny>,
        page_size: Option<&Bound<'_, PyAny>>,
        eviction: Arg<'_>,
        pin_budget_pages: Option<&Bound<'_, PyAny>>,
        clock: Option<Py<PyAny>>,
        fingerprint: Option<&Bound<'_, PyAny>>,
        events: Option<&Bound<'_, PyAny>>,
        lower_tiers: Option<&Bound<'_, PyAny>>,
        store_policy: Option<&Bound<'_, PyAny>>,
        store_options: Option<&Bound<'_, PyAny>>,
        groups: Option<&Bound<'_, PyAny>>,
        miss_ratio_curve: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let eviction = eviction.or("lru".into(), |e| str_arg(e, "eviction"))?;
        let policy: EvictionPolicy = eviction.parse().map_err(|_| {
            KvError::InvalidArgument(format!(
                "eviction must be 'lru', 'lfu' or 'priority', got {eviction:?}"
            ))
        })?;
        let config = ManagerConfig {
            num_pages: count_arg(num_pages, "num_pages")?,
            page_size: match page_size {
                Some(p) if !p.is_none() => count_arg(p, "page_size")?,
                _ => 16,
            },
            policy,
            pin_budget_pages: match pin_budget_pages {
                Some(b) if !b.is_none() => Some(count_arg(b, "pin_budget_pages")?),
                _ => None,
            },
            fingerprint: match fingerprint {
                Some(f) if !f.is_none() => bytes_arg(f, "fingerprint")?,
                _ => Vec::new(),
            },
            events: match events {
                Some(e) => bool_arg(e, "events")?,
                None => false,
            },
            lower_tiers: super::tiers::tier_configs(lower_tiers)?,
            store_policy: super::tiers::store_policy(store_policy, store_options)?,
            groups: groups_arg(groups)?,
        };
        let mrc = mrc_arg(miss_ratio_curve)?;
        let clock = clock.filter(|c| !c.bind(py).is_none());
        if let Some(clock) = &clock {
            if !clock.bind(py).is_callable() {
                return Err(KvError::InvalidArgument("clock must be callable".into()).into());
            }
        }
        // Large pools are built detached: other Python threads keep running meanwhile.
        let inner = super::detach(py, || KVCacheManager::new(config))?;
        if mrc.is_some() {
            inner.set_miss_ratio_curve(mrc);
        }
        Ok(Self {
            tier_names: inner.tier_names(),
            inner,
            gate: parking_lot::Mutex::new(()),
            clock,
            epoch: Instant::now(),
        })
    }

    /// Admit `seq_id` with its prompt: the number of prompt tokens already cached, or None (nothing
    /// changed) if its pages cannot be found even after evicting everything evictable. With
    /// `cache_prompt=False` (chunked prefill) pages are shared only once `commit` says so.
    #[pyo3(
        signature = (seq_id, prompt_tokens, namespace = None, priority = Arg::Missing, *, cache_prompt = Arg::Missing, reserve = None, sink_tokens = None, recent_tokens = None),
        text_signature = "($self, seq_id, prompt_tokens, namespace=None, priority=0, *, cache_prompt=True, reserve=None, sink_tokens=None, recent_tokens=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn add_sequence(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        prompt_tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        priority: Arg<'_>,
        cache_prompt: Arg<'_>,
        reserve: Option<&Bound<'_, PyAny>>,
        sink_tokens: Option<&Bound<'_, PyAny>>,
        recent_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<usize>> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let prompt = tokens(prompt_tokens)?;
        let namespace = namespace_arg(namespace)?;
        let priority: i32 = priority.or(0, |p| int_arg(p, "priority", "the int32 range"))?;
        let cache_prompt = cache_prompt.or(true, |c| bool_arg(c, "cache_prompt"))?;
        let reserve = opt_count(reserve, "reserve")?;
        let streaming = match (
            opt_count(sink_tokens, "sink_tokens")?,
            opt_count(recent_tokens, "recent_tokens")?,
        ) {
            (None, None) => None,
            (sink, Some(recent)) => Some((sink.unwrap_or(0), recent)),
            (Some(_), None) => {
                return Err(KvError::InvalidArgument(
                    "sink_tokens needs recent_tokens (the StreamingLLM window)".into(),
                )
                .into())
            }
        };
        let now = self.now(py)?;
        Ok(self.run(py, prompt.as_slice().len() >= LONG_TOKENS, |m| {
            m.add_sequence_with(
                id,
                prompt,
                namespace.as_deref(),
                priority,
                cache_prompt,
                reserve,
                streaming,
                now,
            )
        })?)
    }

    /// Reserve slots for the next `num_tokens` tokens of the sequence's known prompt (admitted
    /// with `reserve`); False (nothing changed) if there is no room.
    fn reserve(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let n = count_arg(num_tokens, "num_tokens")?;
        let now = self.now(py)?;
        Ok(self.run(py, n >= LONG_TOKENS, |m| m.reserve(id, n, now))?)
    }

    /// `[num_full_pages, 16]` uint8: the page keys of the sequence's full pages (chained SHA-256
    /// over the cache fingerprint, its namespace and each page's tokens; see docs/api.md).
    fn page_keys<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let keys = self.run(py, false, |m| m.page_keys(id))?;
        keys_array(py, &keys)
    }

    /// Events dropped because the log was full (more than `MAX_EVENTS` between two
    /// `take_events` calls, which then returned a snapshot instead), since the manager was built.
    #[getter]
    fn num_events_dropped(&self, py: Python<'_>) -> u64 {
        self.run(py, false, |m| m.num_events_dropped())
    }

    /// The KV events since the last call, in order (`PageStored`, `PageRemoved`, `AllCleared` of
    /// `kvcore.events`); empty when the manager was built without `events=True`. More than
    /// `kvcore.MAX_EVENTS` events between two calls are dropped (the log is bounded): the next call
    /// returns, per medium, `AllCleared(medium)` then its whole content as `PageStored` instead.
    /// Exactly once: if building the events raises (an interrupt), they are put back for the next
    /// call; with `sink` (a list) they are appended to it inside the call, so that an interrupt
    /// as the call returns cannot lose them either (the call then returns an empty list).
    #[pyo3(signature = (sink = None))]
    fn take_events<'py>(
        &self,
        py: Python<'py>,
        sink: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let sink = list_sink(sink, "take_events")?;
        let log = self.run(py, false, |m| m.take_events());
        let built = (|| -> PyResult<Bound<'py, PyList>> {
            let out = PyList::empty(py);
            for event in &log {
                out.append(event_object(py, event)?)?;
            }
            if let Some(sink) = sink {
                // One list.extend: all or nothing.
                sink.call_method1("extend", (&out,))?;
                return Ok(PyList::empty(py));
            }
            Ok(out)
        })();
        if built.is_err() {
            self.inner.restore_events(log);
        }
        built
    }

    /// The cache's root page key (16 bytes): the parent of every first page.
    fn root_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.root_key())
    }

    /// Tokens of `seq_id` with a slot reserved.
    fn num_reserved(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok({
            let id = self::seq_id(seq_id, "seq_id")?;
            self.run(py, false, |m| m.num_reserved(id))
        }?)
    }

    /// The engine computed the first `num_tokens` tokens of `seq_id`: cache their full pages.
    /// Returns the number of the sequence's tokens now cached.
    fn commit(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let n = count_arg(num_tokens, "num_tokens")?;
        let now = self.now(py)?;
        Ok(self.run(py, n >= LONG_TOKENS, |m| m.commit(id, n, now))?)
    }

    /// Reserve slots for generated tokens, and `num_lookahead` more for draft tokens (speculative
    /// decoding); False (nothing changed) if there is no room.
    #[pyo3(signature = (seq_id, new_tokens, num_lookahead = None), text_signature = "($self, seq_id, new_tokens, num_lookahead=0)")]
    fn append(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        new_tokens: &Bound<'_, PyAny>,
        num_lookahead: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let new_tokens = tokens(new_tokens)?;
        let lookahead = match num_lookahead {
            Some(k) => count_arg(k, "num_lookahead")?,
            None => 0,
        };
        let now = self.now(py)?;
        Ok(self.run(py, false, |m| {
            m.append_with_lookahead(id, new_tokens.as_slice(), lookahead, now)
        })?)
    }

    /// One generated token per sequence (`tokens[i]` for `seq_ids[i]`), appended in order under
    /// one call: a decode step. Returns how many were appended before the first that found no
    /// room (that one and the rest unchanged). Nothing changes on a bad or repeated id.
    fn append_batch(
        &self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let ids = seq_ids_arg(seq_ids, "seq_ids")?;
        let toks = self::tokens(tokens)?;
        let now = self.now(py)?;
        Ok(self.run(py, ids.len() >= LONG_BATCH, |m| {
            m.append_batch(&ids, toks.as_slice(), now)
        })?)
    }

    /// Keep at least `num_pages` cached pages of `namespace` (None: the default one) in HBM, or
    /// slots of lower tier `tier`, while other pages can be evicted (0 removes the floor); see
    /// docs/api.md, "Tenant floors".
    #[pyo3(signature = (namespace, num_pages, tier = None))]
    fn set_tenant_floor(
        &self,
        py: Python<'_>,
        namespace: Option<&Bound<'_, PyAny>>,
        num_pages: &Bound<'_, PyAny>,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let namespace = namespace_arg(namespace)?;
        let n = count_arg(num_pages, "num_pages")?;
        let tier = opt_arg(tier, |t| str_arg(t, "tier"))?;
        Ok(self.run(py, false, |m| {
            m.set_tenant_floor(namespace.as_deref(), n, tier.as_deref())
        })?)
    }

    /// Past `num_pages` cached pages (or slots of lower tier `tier`), `namespace`'s pages are
    /// evicted before any other tenant's (None removes the ceiling); see docs/api.md.
    #[pyo3(signature = (namespace, num_pages, tier = None))]
    fn set_tenant_ceiling(
        &self,
        py: Python<'_>,
        namespace: Option<&Bound<'_, PyAny>>,
        num_pages: Option<&Bound<'_, PyAny>>,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let namespace = namespace_arg(namespace)?;
        let n = opt_count(num_pages, "num_pages")?;
        let tier = opt_arg(tier, |t| str_arg(t, "tier"))?;
        Ok(self.run(py, false, |m| {
            m.set_tenant_ceiling(namespace.as_deref(), n, tier.as_deref())
        })?)
    }

    /// `[(namespace, tier, floor, ceiling, cached pages)]` of every tenant quota, sorted.
    #[allow(clippy::type_complexity)]
    fn tenant_quotas(
        &self,
        py: Python<'_>,
    ) -> Vec<(Option<String>, String, usize, Option<usize>, usize)> {
        self.run(py, false, |m| m.tenant_quotas())
    }

    /// `[(namespace, tier, floor, cached pages)]` of every tenant floor (`tier`: "hbm" or a lower
    /// tier's name), sorted.
    fn tenant_floors(&self, py: Python<'_>) -> Vec<(Option<String>, String, usize, usize)> {
        self.run(py, false, |m| m.tenant_floors())
    }

    /// `(name, options)` of the store policy in force (`set_store_policy(*cache.store_policy)`
    /// restores it).
    #[getter]
    fn store_policy<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(String, Bound<'py, pyo3::types::PyDict>)> {
        let policy = self.run(py, false, |m| m.store_policy());
        super::tiers::store_policy_view(py, &policy)
    }

    /// Replace the store policy (`"all"`, `"selective"`, `"value"` and its options, as in the
    /// constructor); queued stores are not affected. Nothing changes on a bad policy.
    #[pyo3(signature = (store_policy, store_options = None))]
    fn set_store_policy(
        &self,
        py: Python<'_>,
        store_policy: &Bound<'_, PyAny>,
        store_options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let policy = super::tiers::store_policy(Some(store_policy), store_options)?;
        Ok(self.run(py, false, |m| m.set_store_policy(policy))?)
    }

    /// Store the sequence's cached full pages to the lower tiers whatever the store policy (a
    /// swap-out before ``free_sequence``); returns the pages stored or in flight in the first tier.
    fn offload(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let now = self.now(py)?;
        Ok(self.run(py, false, |m| m.offload(id, now))?)
    }

    /// Roll `seq_id` back to its first `num_tokens` tokens (rejected drafts), releasing the pages
    /// past them; a kept page that is shared or cached is copied before it is written again.
    fn truncate(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let n = count_arg(num_tokens, "num_tokens")?;
        Ok(self.run_for_seq(py, id, |m| m.truncate(id, n))?)
    }

    /// `child_id` shares every page of `parent_id` (whose tokens must all be computed).
    fn fork(
        &self,
        py: Python<'_>,
        parent_id: &Bound<'_, PyAny>,
        child_id: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let parent = self::seq_id(parent_id, "parent_id")?;
        let child = self::seq_id(child_id, "child_id")?;
        Ok(self.run_for_seq(py, parent, |m| m.fork(parent, child))?)
    }

    /// Release a finished sequence: full pages stay cached, the partial page is freed, and queued
    /// copies into pages nobody else holds are cancelled.
    fn free_sequence(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok({
            let id = self::seq_id(seq_id, "seq_id")?;
            self.run_for_seq(py, id, |m| m.free_sequence(id))
        }?)
    }

    /// `PageTable(kv_indptr, kv_indices, kv_last_page_len)` (int32) of the listed sequences. With
    /// `num_tokens` (`[batch]` ints), sequence `i`'s table covers its first `num_tokens[i]` tokens
    /// only (a prefill chunk). With `out` (a `PageTable`, or any 3-tuple, of writable int32 buffers
    /// reused from step to step), the table is written into it and views of the used prefixes are
    /// returned: nothing is allocated but the views.
    #[pyo3(signature = (seq_ids, num_tokens = None, out = None, *, group = None, compact = None))]
    fn page_table<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        num_tokens: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        group: Option<&Bound<'py, PyAny>>,
        compact: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let seq_ids = seq_ids_arg(seq_ids, "seq_ids")?;
        let group = opt_count(group, "group")?.unwrap_or(0);
        let compact = opt_arg(compact, |c| bool_arg(c, "compact"))?.unwrap_or(false);
        let counts = opt_arg(num_tokens, |n| counts_arg(n, "num_tokens"))?;
        let counts = counts.as_deref();
        let page_table = python_attr(py, &PAGE_TABLE, "kvcore.manager", "PageTable")?;
        let Some(out) = out.filter(|o| !o.is_none()) else {
            // Built under the manager's lock into Rust vectors, handed to NumPy without a copy.
            let table = self.run(py, seq_ids.len() >= LONG_BATCH, |m| {
                m.page_table(&seq_ids, counts, group, compact)
            })?;
            let indptr = PyArray1::from_vec(py, table.kv_indptr);
            let indices = PyArray1::from_vec(py, table.kv_indices);
            let last = PyArray1::from_vec(py, table.kv_last_page_len);
            return super::new_named_tuple(&page_table, (indptr, indices, last).into_pyobject(py)?);
        };
        const NAMES: [&str; 3] = ["kv_indptr", "kv_indices", "kv_last_page_len"];
        let bad_out = || {
            PyErr::from(KvError::InvalidDType(
                "out must be a PageTable (or a 3-tuple) of 1-D int32 arrays \
                 (kv_indptr, kv_indices, kv_last_page_len)"
                    .into(),
            ))
        };
        let parts = out.cast::<PyTuple>().map_err(|_| bad_out())?;
        if parts.len() != 3 {
            return Err(bad_out());
        }
        let buffer = |i: usize| -> PyResult<Bound<'py, PyArray1<i32>>> {
            parts
                .get_item(i)?
                .cast_into::<PyArray1<i32>>()
                .map_err(|_| {
                    KvError::InvalidDType(format!("out.{} must be a 1-D int32 array", NAMES[i]))
                        .into()
                })
        };
        let (indptr, indices, last) = (buffer(0)?, buffer(1)?, buffer(2)?);
        // Three distinct arrays may still share memory (three `np.frombuffer` of one buffer have
        // three bases, which rust-numpy's borrow tracking keys on): their byte ranges must not meet.
        let span = |a: &Bound<'py, PyArray1<i32>>| {
            let start = a.data() as usize;
            start..start + a.len() * std::mem::size_of::<i32>()
        };
        let spans = [span(&indptr), span(&indices), span(&last)];
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let (x, y) = (&spans[i], &spans[j]);
            if !x.is_empty() && !y.is_empty() && x.start < y.end && y.start < x.end {
                return Err(KvError::InvalidDType(format!(
                    "out.{} and out.{} share memory: the out buffers must be distinct arrays",
                    NAMES[i], NAMES[j]
                ))
                .into());
            }
        }
        let total = {
            let not_writable = |_| {
                PyErr::from(KvError::InvalidDType(
                    "out buffers must be distinct, writable arrays".into(),
                ))
            };
            let mut w_indptr = indptr.try_readwrite().map_err(not_writable)?;
            let mut w_indices = indices.try_readwrite().map_err(not_writable)?;
            let mut w_last = last.try_readwrite().map_err(not_writable)?;
            let contiguous = |_| {
                PyErr::from(KvError::InvalidDType(
                    "out buffers must be contiguous".into(),
                ))
            };
            // Written through rust-numpy's exclusive borrow (no other Rust borrower); nothing of
            // kvcore's state is read back from these caller-owned buffers.
            let (a, b, c) = (
                w_indptr.as_slice_mut().map_err(contiguous)?,
                w_indices.as_slice_mut().map_err(contiguous)?,
                w_last.as_slice_mut().map_err(contiguous)?,
            );
            let long = seq_ids.len() >= LONG_BATCH;
            self.run(py, long, |m| {
                m.page_table_into(&seq_ids, counts, group, compact, a, b, c)
            })?
        };
        let batch = seq_ids.len();
        let view = |a: &Bound<'py, PyArray1<i32>>, n: usize| {
            a.get_item(PySlice::new(py, 0, n as isize, 1))
        };
        let (indptr, indices, last) = (
            view(&indptr, batch + 1)?,
            view(&indices, total)?,
            view(&last, batch)?,
        );
        super::new_named_tuple(&page_table, (indptr, indices, last).into_pyobject(py)?)
    }

    /// `BatchLayout(page_table, q_indptr, positions, slot_mapping)` of one step's rows, in one
    /// call: row `i` computes `num_tokens[i]` tokens of `seq_ids[i]` from token `starts[i]` (a
    /// decode row 1, a prefill chunk more), and its table is cut at its last one.
    #[pyo3(signature = (seq_ids, starts, num_tokens, *, group = None))]
    fn batch_layout<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        starts: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let seq_ids = seq_ids_arg(seq_ids, "seq_ids")?;
        let starts = counts_arg(starts, "starts")?;
        let counts = counts_arg(num_tokens, "num_tokens")?;
        let group = opt_count(group, "group")?.unwrap_or(0);
        let page_table = python_attr(py, &PAGE_TABLE, "kvcore.manager", "PageTable")?;
        let batch_layout = python_attr(py, &BATCH_LAYOUT, "kvcore.manager", "BatchLayout")?;
        let tokens = counts.iter().fold(0usize, |a, &n| a.saturating_add(n));
        let long = seq_ids.len() >= LONG_BATCH || tokens >= LONG_TOKENS;
        let layout = self.run(py, long, |m| {
            m.batch_layout(&seq_ids, &starts, &counts, group)
        })?;
        let table = layout.table;
        let table = (
            PyArray1::from_vec(py, table.kv_indptr),
            PyArray1::from_vec(py, table.kv_indices),
            PyArray1::from_vec(py, table.kv_last_page_len),
        );
        let table = super::new_named_tuple(&page_table, table.into_pyobject(py)?)?;
        let items = (
            table,
            PyArray1::from_vec(py, layout.q_indptr),
            PyArray1::from_vec(py, layout.positions),
            PyArray1::from_vec(py, layout.slot_mapping),
        );
        super::new_named_tuple(&batch_layout, items.into_pyobject(py)?)
    }

    /// The int64 slots (`page_id * page_size + offset`) of `num_tokens` tokens of `seq_id` from
    /// token `start` (default: the last `num_tokens`).
    #[pyo3(signature = (seq_id, num_tokens, start = None, *, group = None))]
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        start: Option<&Bound<'py, PyAny>>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let group = opt_count(group, "group")?.unwrap_or(0);
        let id = self::seq_id(seq_id, "seq_id")?;
        let n = count_arg(num_tokens, "num_tokens")?;
        let start = opt_count(start, "start")?;
        Ok(PyArray1::from_vec(
            py,
            self.run(py, n >= LONG_TOKENS, |m| {
                m.slot_mapping(id, n, start, group)
            })?,
        ))
    }

    /// The dense `[batch, max_pages]` int32 block table (vLLM / FlashAttention format): row `i`
    /// holds sequence `i`'s pages, padded with the null page 0. With `out` (a writable C-contiguous
    /// `[rows >= batch, cols >= max_pages]` int32 array reused from step to step), rows `0..batch`
    /// are written (padded to `cols`) and the view `out[:batch, :max_pages]` is returned.
    #[pyo3(signature = (seq_ids, out = None, *, group = None))]
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let seq_ids = seq_ids_arg(seq_ids, "seq_ids")?;
        let group = opt_count(group, "group")?.unwrap_or(0);
        let Some(out) = out.filter(|o| !o.is_none()) else {
            let (rows, width) = self.run(py, seq_ids.len() >= LONG_BATCH, |m| {
                m.block_table(&seq_ids, group)
            })?;
            return Ok(PyArray1::from_vec(py, rows)
                .reshape([seq_ids.len(), width])?
                .into_any());
        };
        let array = out.cast::<PyArray2<i32>>().map_err(|_| {
            PyErr::from(KvError::InvalidDType(
                "out must be a 2-D int32 array [rows, cols]".into(),
            ))
        })?;
        if !array.is_c_contiguous() {
            // A Fortran-ordered buffer is contiguous too, but its rows are not: refused.
            return Err(KvError::InvalidDType("out must be C-contiguous".into()).into());
        }
        let row_len = array.shape()[1];
        let width = {
            let mut w = array.try_readwrite().map_err(|_| {
                PyErr::from(KvError::InvalidDType("out must be a writable array".into()))
            })?;
            let slice = w.as_slice_mut().map_err(|_| {
                PyErr::from(KvError::InvalidDType("out must be C-contiguous".into()))
            })?;
            // Written through rust-numpy's exclusive borrow; nothing is read back from `out`.
            let long = seq_ids.len() >= LONG_BATCH;
            self.run(py, long, |m| {
                m.block_table_into(&seq_ids, slice, row_len, group)
            })?
        };
        let rows = PySlice::new(py, 0, seq_ids.len() as isize, 1);
        let cols = PySlice::new(py, 0, width as isize, 1);
        array.get_item((rows, cols))
    }

    /// Evict up to `num_pages` cached pages; returns how many were evicted.
    fn evict(&self, py: Python<'_>, num_pages: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = count_arg(num_pages, "num_pages")?;
        let now = self.now(py)?;
        Ok(self.run(py, n >= LONG_PAGES, |m| m.evict(n, now))?)
    }

    /// Keep the cached prefix of `tokens` resident for `ttl_s` seconds; returns pages pinned.
    #[pyo3(signature = (tokens, ttl_s, namespace = None))]
    fn pin(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        ttl_s: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let ids = self::tokens(tokens)?;
        let ttl = seconds_to_micros(float_arg(ttl_s, "ttl_s")?, "ttl_s")?;
        let namespace = namespace_arg(namespace)?;
        let now = self.now(py)?;
        Ok(self.run(py, ids.as_slice().len() >= LONG_TOKENS, |m| {
            m.pin(ids.as_slice(), ttl, namespace.as_deref(), now)
        })?)
    }

    /// Shorten every pin that would outlive `max_ttl_s` seconds from now to expire then; returns
    /// the pins shortened.
    fn cap_pins(&self, py: Python<'_>, max_ttl_s: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ttl = seconds_to_micros(float_arg(max_ttl_s, "max_ttl_s")?, "max_ttl_s")?;
        let now = self.now(py)?;
        Ok(self.run(py, false, |m| m.cap_pins(ttl, now)))
    }

    /// Remove pins on the prefix of `tokens`; returns pages unpinned.
    #[pyo3(signature = (tokens, namespace = None))]
    fn unpin(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        self.run_lookup(py, tokens, namespace, |m, ids, ns| m.unpin(ids, ns))
    }

    /// Cached tokens a lookup of `tokens` would find now (whole pages; no side effects).
    #[pyo3(signature = (tokens, namespace = None))]
    fn peek_prefix_len(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        self.run_lookup(py, tokens, namespace, |m, ids, ns| {
            m.peek_prefix_len(ids, ns)
        })
    }

    /// `PrefixMatch(num_tokens, pages)`: the longest cached prefix of `tokens` visible from
    /// `namespace` and its pages (int32), without side effects (nothing touched or locked).
    #[pyo3(signature = (tokens, namespace = None))]
    fn match_prefix<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        namespace: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let found = self.run_lookup(py, tokens, namespace, |m, ids, ns| m.match_prefix(ids, ns))?;
        let pages: Vec<i32> = found.pages.iter().map(|&p| p as i32).collect();
        let pages = PyArray1::from_vec(py, pages);
        tuple_attr(
            py,
            &PREFIX_MATCH,
            "kvcore.manager",
            "PrefixMatch",
            (found.num_tokens, pages),
        )
    }

    /// `n` fresh pages held by the caller (int32), to load K/V computed elsewhere into and
    /// `insert`; None (nothing changed) if they cannot be found even after evicting.
    fn allocate_pages<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let n = count_arg(n, "n")?;
        let now = self.now(py)?;
        Ok(self
            .run(py, n >= LONG_PAGES, |m| m.allocate_pages(n, now))?
            .map(|pages| PyArray1::from_vec(py, pages.into_iter().map(|p| p as i32).collect())))
    }

    /// Drop the caller's reference on pages from `allocate_pages` (adopted ones stay cached).
    fn free_pages(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = page_ids(pages)?;
        Ok(self.run(py, ids.as_slice().len() >= LONG_PAGES, |m| {
            m.free_pages(ids.as_slice())
        })?)
    }

    /// Cache `tokens` (`len(pages) * page_size` of them) with their K/V in caller-held `pages`;
    /// returns how many pages the tree adopted (the others' prefix was cached already).
    #[pyo3(signature = (tokens, pages, namespace = None))]
    fn insert(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let ids = self::tokens(tokens)?;
        let pages = page_ids(pages)?;
        let namespace = namespace_arg(namespace)?;
        let now = self.now(py)?;
        Ok(self.run(py, pages.as_slice().len() >= LONG_PAGES, |m| {
            m.insert(ids.as_slice(), pages.as_slice(), namespace.as_deref(), now)
        })?)
    }

    /// Drop every cached page no live sequence uses, pins included; returns the pages dropped.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        let now = self.now(py)?;
        Ok(self.run(py, true, |m| m.reset_prefix_cache(now))?)
    }

    /// `{page: references}` the caller holds from `allocate_pages` (for checks and debugging).
    fn caller_held_pages(&self, py: Python<'_>) -> std::collections::HashMap<u32, u32> {
        let pages = self.run(py, true, |m| m.caller_held_pages());
        pages.into_iter().map(|p| (p, 1)).collect()
    }

    /// `[n, 2]` int32 `(src_page, dst_page)` copies queued by copy-on-write since the last call:
    /// one valid batch for `kernels.copy_pages` (distinct destinations, no destination a source).
    fn take_pending_copies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let pairs = self.run(py, false, |m| m.take_pending_copies())?;
        let flat: Vec<i32> = pairs
            .iter()
            .flat_map(|&(s, d)| [s as i32, d as i32])
            .collect();
        PyArray1::from_vec(py, flat).reshape([pairs.len(), 2])
    }

    /// A `kvcore.CacheStats` snapshot (usage split and counters).
    /// Names of the lower tiers, fastest first (a transfer row's `tier` indexes this).
    #[getter]
    fn tier_names(&self) -> Vec<String> {
        self.tier_names.clone()
    }

    /// Queued transfers as a `TransferBatch`, now in flight: copy the bytes (`kvcore.tiers.Mover`)
    /// and report each op with `complete_transfers`. Take stores only after the step that wrote
    /// their pages; loads any time (`stores=False` before a step, to overlap them with it). With
    /// `sink` (a list), the batch is also appended to it before the call returns: an interrupt
    /// raised as the call returns (a signal handler runs there) cannot lose it. If the batch
    /// cannot be handed over (no memory for its arrays), its ops are failed, nothing stays held.
    #[pyo3(
        signature = (*, stores = Arg::Missing, loads = Arg::Missing, sink = None),
        text_signature = "($self, *, stores=True, loads=True, sink=None)"
    )]
    fn take_transfers<'py>(
        &self,
        py: Python<'py>,
        stores: Arg<'_>,
        loads: Arg<'_>,
        sink: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let stores = stores.or(true, |b| bool_arg(b, "stores"))?;
        let loads = loads.or(true, |b| bool_arg(b, "loads"))?;
        let sink = list_sink(sink, "take_transfers")?;
        let batch = self.run(py, false, |m| m.take_transfers(stores, loads));
        let ops: Vec<u64> = {
            let mut ops: Vec<u64> = batch.stores.iter().map(|r| r.op).collect();
            ops.sort_unstable();
            ops.dedup();
            ops.extend(batch.loads.iter().map(|r| r.op));
            ops
        };
        let names = self.tier_names.clone();
        let handed = python_attr(py, &TRANSFER_BATCH, "kvcore.manager", "TransferBatch")
            .and_then(|class| {
                super::tiers::batch_to_python(py, &class, batch, self.inner.page_size(), names)
            })
            .and_then(|b| match sink {
                Some(list) => list.append(&b).map(|()| b),
                None => Ok(b),
            });
        if handed.is_err() && !ops.is_empty() {
            // Nobody can complete ops they never received: fail them (their pages and slots go back).
            let fail = vec![false; ops.len()];
            let now = self
                .now(py)
                .unwrap_or_else(|_| self.epoch.elapsed().as_micros() as u64);
            self.run(py, false, |m| m.complete_transfers(&ops, &fail, now))?;
        }
        handed
    }

    /// Report transfers taken with `take_transfers`: `ok[i]` (a bool, or one bool for all) for op
    /// `op_ids[i]`. Nothing changes if an id is not in flight or listed twice.
    fn complete_transfers(
        &self,
        py: Python<'_>,
        op_ids: &Bound<'_, PyAny>,
        ok: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = op_ids_arg(op_ids)?;
        let outcomes: Vec<bool> = if let Ok(all) = ok.extract::<bool>() {
            vec![all; ids.len()]
        } else {
            let mut v = Vec::new();
            for (i, item) in ok
                .try_iter()
                .map_err(|_| {
                    KvError::InvalidDType("ok must be a bool or a sequence of bools".into())
                })?
                .enumerate()
            {
                v.push(bool_arg(&item?, &format!("ok[{i}]"))?);
            }
            v
        };
        let now = self.now(py)?;
        Ok(self.run(py, ids.len() >= LONG_PAGES, |m| {
            m.complete_transfers(&ids, &outcomes, now)
        })?)
    }

    /// Check, changing nothing, that every op of `op_ids` is a taken transfer still in flight (each
    /// listed once), as `complete_transfers` requires; raises `InvalidArgumentError` otherwise. A
    /// mover asks before copying: a completed batch's pages and slots may be another's now.
    fn check_transfers(&self, py: Python<'_>, op_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = op_ids_arg(op_ids)?;
        Ok(self.run(py, ids.len() >= LONG_PAGES, |m| m.check_transfers(&ids))?)
    }

    /// Whether `seq_id`'s prefix is in HBM (no load from a lower tier in flight): its tables are
    /// valid and the engine may compute it.
    fn is_ready(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = self::seq_id(seq_id, "seq_id")?;
        Ok(self.run(py, false, |m| m.is_ready(id))?)
    }

    /// `{"hbm": tokens, tier name: tokens, ...}`: where `seq_id`'s prefix hit comes from (while
    /// loading, what is being loaded; once ready, what was: a failed load cut the hit before it).
    fn hit_tokens<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let hit = self.run(py, false, |m| m.hit_tokens(id))?;
        hit_dict(py, &self.tier_names, &hit)
    }

    /// `{"hbm": tokens, tier name: tokens, ...}`: the longest prefix of `tokens` an admission would
    /// find now, per medium, without side effects (for routers and schedulers: where a prompt's
    /// cached prefix lives, hence what it costs to start).
    #[pyo3(signature = (tokens, namespace = None))]
    fn peek_hit_tokens<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        namespace: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let hit = self.run_lookup(py, tokens, namespace, |m, ids, ns| {
            m.peek_hit_tokens(ids, ns)
        })?;
        hit_dict(py, &self.tier_names, &hit)
    }

    /// `[n, 16]` uint8: the page keys of the full pages of `tokens` in `namespace`, as this cache
    /// names them (its fingerprint): what a shared tier is asked for. With `public_pages`, the
    /// first ones are keyed as a public prefix (a shared system prompt), the rest chained from
    /// them, as the cache keys a namespace's pages after a public prefix. No side effects.
    #[pyo3(signature = (tokens, namespace = None, *, public_pages = None))]
    fn prompt_keys<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        namespace: Option<&Bound<'py, PyAny>>,
        public_pages: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let public = opt_count(public_pages, "public_pages")?.unwrap_or(0);
        let keys = self.run_lookup(py, tokens, namespace, |m, ids, ns| {
            m.prompt_keys(ids, ns, public)
        })?;
        keys_array(py, &keys)
    }

    /// Leading full pages of `tokens` (in `namespace`) that lower tier `tier` indexes. No side
    /// effects.
    #[pyo3(signature = (tier, tokens, namespace = None))]
    fn tier_prefix_len(
        &self,
        py: Python<'_>,
        tier: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let tier = str_arg(tier, "tier")?;
        Ok(self.run_lookup(py, tokens, namespace, |m, ids, ns| {
            m.tier_prefix_len(&tier, ids, ns)
        })??)
    }

    /// Index the first `num_pages` full pages of `tokens` in lower tier `tier` without a transfer,
    /// because the tier says it holds them (a shared tier another instance filled). Returns the
    /// pages newly indexed. A page the tier does not hold after all fails its load.
    #[pyo3(signature = (tier, tokens, num_pages, namespace = None, *, public_pages = None))]
    fn mark_tier_pages(
        &self,
        py: Python<'_>,
        tier: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        num_pages: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        public_pages: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let tier = str_arg(tier, "tier")?;
        let (ids, namespace) = lookup_args(tokens, namespace)?;
        let n = count_arg(num_pages, "num_pages")?;
        let public = opt_count(public_pages, "public_pages")?;
        let now = self.now(py)?;
        Ok(self.run(py, n >= LONG_PAGES, |m| {
            m.mark_tier_pages(&tier, ids.as_slice(), n, namespace.as_deref(), public, now)
        })?)
    }

    /// `{tier name: {counter: value}}`: occupancy and counters of each lower tier.
    fn tier_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.run(py, false, |m| m.tier_stats());
        let out = PyDict::new(py);
        for t in stats {
            let d = PyDict::new(py);
            d.set_item("num_slots", t.num_slots)?;
            d.set_item("num_slots_cached", t.num_slots_cached)?;
            d.set_item("num_slots_bad", t.num_slots_bad)?;
            d.set_item("num_slots_in_flight", t.num_slots_in_flight)?;
            d.set_item("num_slots_free", t.num_slots_free)?;
            d.set_item("num_slots_locked", t.num_slots_locked)?;
            d.set_item("num_stored_pages", t.num_stored_pages)?;
            d.set_item("num_store_failed_pages", t.num_store_failed_pages)?;
            d.set_item("num_store_skipped_no_room", t.num_store_skipped_no_room)?;
            d.set_item("num_store_skipped_in_flight", t.num_store_skipped_in_flight)?;
            d.set_item("num_loaded_pages", t.num_loaded_pages)?;
            d.set_item("num_load_failed_pages", t.num_load_failed_pages)?;
            d.set_item("hit_tokens", t.hit_tokens)?;
            d.set_item("num_evicted_slots", t.num_evicted_slots)?;
            d.set_item("num_restored_pages", t.num_restored_pages)?;
            d.set_item("num_marked_pages", t.num_marked_pages)?;
            d.set_item("num_dropped_bad_slots", t.num_dropped_bad_slots)?;
            out.set_item(t.name, d)?;
        }
        Ok(out)
    }

    /// Rebuild a lower tier's index from `entries` a previous run stored (`DiskTier.entries()`:
    /// `(slot, key, parent_key, namespace, tokens)` each). A page is accepted only if its key is
    /// what this cache computes from its parent (this cache's root key for a first page: same
    /// fingerprint only), namespace and tokens, and its slot is free. Returns a bool array:
    /// accepted or not, per entry; with `reasons=True`, a list of str: `"accepted"` or why not.
    #[pyo3(signature = (name, entries, *, reasons = None))]
    fn restore_tier<'py>(
        &self,
        py: Python<'py>,
        name: &Bound<'py, PyAny>,
        entries: &Bound<'py, PyAny>,
        reasons: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reasons = reasons.map_or(Ok(false), |r| bool_arg(r, "reasons"))?;
        let name = str_arg(name, "name")?;
        let mut pages = Vec::new();
        for (i, e) in iter_arg(entries, "entries")?.enumerate() {
            let e = e?;
            let t = e.cast::<PyTuple>().map_err(|_| {
                KvError::InvalidArgument(format!(
                    "entries[{i}] must be a (slot, key, parent_key, namespace, tokens) tuple"
                ))
            })?;
            if t.len() != 5 {
                return Err(KvError::InvalidArgument(format!(
                    "entries[{i}] must be a (slot, key, parent_key, namespace, tokens) tuple"
                ))
                .into());
            }
            let key16 = |o: Bound<'py, PyAny>, what: &str| -> PyResult<[u8; 16]> {
                let b = bytes_arg(&o, what)?;
                b.try_into().map_err(|_| {
                    KvError::InvalidArgument(format!("entries[{i}]: {what} must be 16 bytes"))
                        .into()
                })
            };
            pages.push(crate::manager::RestoredPage {
                slot: int_arg(&t.get_item(0)?, "a slot", "0..2**32-1")?,
                key: key16(t.get_item(1)?, "key")?,
                parent_key: key16(t.get_item(2)?, "parent_key")?,
                namespace: super::tiers::namespace_of(&t.get_item(3)?)?,
                tokens: tokens(&t.get_item(4)?)?.as_slice().to_vec(),
            });
        }
        let now = self.now(py)?;
        let outcome = self.run(py, true, |m| m.restore_tier(&name, &pages, now))?;
        if reasons {
            let names: Vec<&str> = outcome.iter().map(|o| o.name()).collect();
            return Ok(PyList::new(py, names)?.into_any());
        }
        let accepted = outcome
            .iter()
            .map(|&o| o == crate::manager::RestoreOutcome::Accepted);
        Ok(PyArray1::from_iter(py, accepted).into_any())
    }

    /// Check the lower tiers' and the tree's invariants (tests); `InternalError` on a violation.
    fn _check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, true, |m| m.check_tiers())
            .map_err(|e| KvError::Internal(format!("invariant broken: {e}")).into())
    }

    fn stats(&self, py: Python<'_>) -> PyResult<CacheStats> {
        let now = self.now(py)?;
        Ok(self.run(py, false, |m| m.stats(now)))
    }

    /// The stats in Prometheus text exposition format.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let stats = Bound::new(py, self.stats(py)?)?;
        let tiers = self.tier_stats(py)?;
        let mrc = self.miss_ratio_curve(py, None)?;
        call_attr(
            py,
            &METRICS_TEXT,
            "kvcore.metrics",
            "metrics_text",
            (stats, "kvcore", tiers, py.None(), mrc),
        )?
        .extract()
    }

    /// `MissRatioCurve(sizes_pages, hit_rate, ...)`: the prompt-token hit rate an LRU cache of each
    /// size (pages; default: HBM x 1/8 .. 16, HBM plus the lower tiers, the largest reuse distance)
    /// would have had on the admissions seen, or None if the curve is off (`miss_ratio_curve=`).
    #[pyo3(signature = (sizes = None))]
    fn miss_ratio_curve<'py>(
        &self,
        py: Python<'py>,
        sizes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let sizes: Option<Vec<u64>> = match sizes.filter(|s| !s.is_none()) {
            Some(s) => Some(
                counts_arg(s, "sizes")?
                    .into_iter()
                    .map(|n| n as u64)
                    .collect(),
            ),
            None => None,
        };
        let Some(r) = self.run(py, false, |m| m.miss_ratio_curve(sizes.as_deref())) else {
            return Ok(None);
        };
        let sizes: Vec<i64> = r
            .sizes
            .iter()
            .map(|&n| n.min(i64::MAX as u64) as i64)
            .collect();
        let items = (
            PyArray1::from_vec(py, sizes),
            PyArray1::from_vec(py, r.hit_rates),
            r.sample_rate,
            r.num_samples,
            r.max_samples,
            r.lookup_pages,
            r.prompt_tokens,
            r.max_distance,
        );
        tuple_attr(
            py,
            &MISS_RATIO_CURVE,
            "kvcore.manager",
            "MissRatioCurve",
            items,
        )
        .map(Some)
    }

    /// Forget what the miss-ratio curve has seen (it counts again from the next admission);
    /// False if it is off.
    fn reset_miss_ratio_curve(&self, py: Python<'_>) -> bool {
        self.run(py, false, |m| m.reset_miss_ratio_curve())
    }

    /// Tokens of `seq_id`.
    fn seq_len(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok({
            let id = self::seq_id(seq_id, "seq_id")?;
            self.run(py, false, |m| m.seq_len(id))
        }?)
    }

    /// The page table of one sequence (int32 copy) in KV-cache group `group`.
    #[pyo3(signature = (seq_id, *, group = None))]
    fn seq_pages<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let group = opt_count(group, "group")?.unwrap_or(0);
        let pages: Vec<i32> = {
            let id = self::seq_id(seq_id, "seq_id")?;
            self.run(py, false, |m| m.seq_group_pages(id, group))
        }?
        .into_iter()
        .map(|p| p as i32)
        .collect();
        Ok(PyArray1::from_vec(py, pages))
    }

    /// int32 original positions of the kept tokens of `seq_ids` in group `group`, concatenated in
    /// batch order: the position map of `page_table(seq_ids, group=group, compact=True)`.
    #[pyo3(signature = (seq_ids, *, group = None))]
    fn positions<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let seq_ids = seq_ids_arg(seq_ids, "seq_ids")?;
        let group = opt_count(group, "group")?.unwrap_or(0);
        let out = self.run(py, seq_ids.len() >= LONG_BATCH, |m| {
            m.positions(&seq_ids, group)
        })?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// `PrefixHit(num_tokens, group_tokens, reason)` of the sequence's admission.
    fn prefix_hit<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let hit = self.run(py, false, |m| m.prefix_hit(id))?;
        tuple_attr(
            py,
            &PREFIX_HIT,
            "kvcore.manager",
            "PrefixHit",
            (hit.num_tokens, hit.group_tokens, hit.reason.name()),
        )
    }

    /// Release the lowest-scoring full-attention pages of `seq_id` until it holds at most
    /// `max_pages` (page-level heavy hitters); returns the number released.
    #[pyo3(signature = (seq_id, scores, max_pages, *, sink_tokens = None, recent_tokens = None))]
    fn compact(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        scores: &Bound<'_, PyAny>,
        max_pages: &Bound<'_, PyAny>,
        sink_tokens: Option<&Bound<'_, PyAny>>,
        recent_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let id = self::seq_id(seq_id, "seq_id")?;
        let max_pages = count_arg(max_pages, "max_pages")?;
        let sink = opt_count(sink_tokens, "sink_tokens")?.unwrap_or(0);
        let recent = opt_count(recent_tokens, "recent_tokens")?.unwrap_or(0);
        let scores = floats_arg(scores, "scores")?;
        Ok(self.run(py, false, |m| {
            m.compact(id, &scores, max_pages, sink, recent)
        })?)
    }

    /// Windows of the KV-cache groups (`None`: full attention), in the order given.
    #[getter]
    fn groups(&self, py: Python<'_>) -> PyResult<Vec<Option<usize>>> {
        Ok(self.run(py, false, |m| Ok::<_, KvError>(m.group_windows()))?)
    }

    /// A manager for `model` (a preset name, a `config.json` path or a `kvcore.sizing` model
    /// spec): one KV-cache group per group of layers of the same attention (full, or each
    /// sliding window), as `kvcore.sizing.kv_cache_groups` derives them.
    #[classmethod]
    #[pyo3(signature = (model, num_pages, page_size = None, **kwargs))]
    fn for_model<'py>(
        cls: &Bound<'py, pyo3::types::PyType>,
        model: &Bound<'py, PyAny>,
        num_pages: &Bound<'py, PyAny>,
        page_size: Option<&Bound<'py, PyAny>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        let windows = call_attr(
            py,
            &GROUP_WINDOWS,
            "kvcore.manager",
            "_group_windows",
            (model,),
        )?;
        let kw = match kwargs {
            Some(k) => k.copy()?,
            None => PyDict::new(py),
        };
        if kw.contains("groups")? {
            return Err(KvError::InvalidArgument(
                "for_model derives groups from the model: do not pass groups".into(),
            )
            .into());
        }
        kw.set_item("page_size", page_size)?;
        kw.set_item("groups", windows)?;
        cls.call((num_pages,), Some(&kw))
    }

    /// Every page the prefix tree holds (int32, no particular order).
    fn cached_pages<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        PyArray1::from_vec(
            py,
            self.run(py, true, |m| m.cached_pages())
                .into_iter()
                .map(|p| p as i32)
                .collect(),
        )
    }

    /// Live sequence ids.
    fn seq_ids(&self, py: Python<'_>) -> Vec<SeqId> {
        self.run(py, false, |m| m.seq_ids())
    }

    /// Namespace names the manager keeps: those with a live sequence or a cached page. A
    /// namespace that holds nothing costs nothing.
    fn num_namespaces(&self, py: Python<'_>) -> usize {
        self.run(py, false, |m| m.num_namespaces())
    }

    /// References held on `page` (the tree's, each sequence's, and a queued copy's).
    fn ref_count(&self, page: &Bound<'_, PyAny>) -> PyResult<u32> {
        let page = page_arg(page, self.inner.num_pages())?;
        Ok(self.inner.ref_count(page)?)
    }

    /// Check page ids against the pool (raises like the allocator does); for callers validating input.
    fn check_pages(&self, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = page_ids(pages)?;
        for &p in ids.as_slice() {
            self.inner.ref_count(p)?;
        }
        Ok(())
    }

    #[getter]
    fn num_pages(&self) -> usize {
        self.inner.num_pages()
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn __contains__(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> bool {
        int_value(seq_id, "seq_id").is_ok_and(|id| self.run(py, false, |m| m.contains(id)))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.run(py, false, |m| m.seq_ids()).len()
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheManager(num_pages={}, page_size={})",
            self.inner.num_pages(),
            self.inner.page_size()
        )
    }
}

#[pymethods]
impl CacheStats {
    /// Fraction of looked-up prompt tokens that were cached (0 before any lookup).
    #[getter(hit_rate)]
    fn py_hit_rate(&self) -> f64 {
        self.hit_rate()
    }

    /// Fraction of usable pages in use (what a scheduler admits against; cached pages excluded).
    #[getter(usage)]
    fn py_usage(&self) -> f64 {
        self.usage()
    }

    /// Fraction of usable pages not free (in use, cached or pinned).
    #[getter(occupancy)]
    fn py_occupancy(&self) -> f64 {
        self.occupancy()
    }

    /// The fields as a dict, in declaration order.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in CacheStats::FIELDS.iter().zip(self.values()) {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// A snapshot is immutable: a copy is itself.
    fn __copy__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __deepcopy__<'py>(slf: PyRef<'py, Self>, _memo: &Bound<'py, PyAny>) -> PyRef<'py, Self> {
        slf
    }

    /// Pickled as its values (`kvcore._kvcore._cache_stats` rebuilds it).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, (Vec<u64>,))> {
        let rebuild = py.import("kvcore._kvcore")?.getattr("_cache_stats")?;
        Ok((rebuild, (self.values(),)))
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = CacheStats::FIELDS
            .iter()
            .zip(self.values())
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        format!("CacheStats({})", fields.join(", "))
    }
}

/// A `CacheStats` from its values in field order (what pickling stores).
#[pyfunction]
#[pyo3(name = "_cache_stats")]
pub(crate) fn py_cache_stats(values: Vec<u64>) -> PyResult<CacheStats> {
    CacheStats::from_values(&values).ok_or_else(|| {
        KvError::InvalidArgument(format!(
            "CacheStats has {} fields, got {} values",
            CacheStats::FIELDS.len(),
            values.len()
        ))
        .into()
    })
}

/// Page keys as a `[n, 16]` uint8 array.
pub(crate) fn keys_array<'py>(
    py: Python<'py>,
    keys: &[crate::keys::PageKey],
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let flat: Vec<u8> = keys.iter().flatten().copied().collect();
    PyArray1::from_vec(py, flat).reshape([keys.len(), 16])
}

/// `page_keys(tokens, page_size, fingerprint=None, namespace=None)`: the page keys of the full
/// pages of `tokens` as a cache with this fingerprint computes them (for routers and other
/// implementations; see docs/api.md for the format and test vectors).
#[pyfunction]
#[pyo3(
    name = "page_keys",
    signature = (tokens, page_size, fingerprint = None, namespace = None, *, public_pages = None)
)]
pub(crate) fn py_page_keys<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    page_size: &Bound<'py, PyAny>,
    fingerprint: Option<&Bound<'py, PyAny>>,
    namespace: Option<&Bound<'py, PyAny>>,
    public_pages: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    use crate::keys::{page_keys_over_public, root_key, KeyNamespace};
    let public = opt_count(public_pages, "public_pages")?.unwrap_or(0);
    let ids = self::tokens(tokens)?;
    let page_size = count_arg(page_size, "page_size")?;
    if page_size == 0 {
        return Err(KvError::InvalidArgument("page_size must be at least 1".into()).into());
    }
    let fingerprint = match fingerprint {
        Some(f) if !f.is_none() => bytes_arg(f, "fingerprint")?,
        _ => Vec::new(),
    };
    let namespace = namespace_arg(namespace)?;
    let ns = KeyNamespace::of(namespace.as_deref());
    let mut keys = Vec::new();
    page_keys_over_public(
        &root_key(&fingerprint),
        ns,
        ids.as_slice(),
        page_size,
        public,
        &mut keys,
    );
    keys_array(py, &keys)
}

/// `payload_checksum(data)`: XXH3-128 of a contiguous 1-D uint8 array, or of the concatenation
/// of a list or tuple of them (a page read straight into its pool pieces), 16 bytes
/// little-endian.
#[pyfunction]
#[pyo3(name = "payload_checksum")]
pub(crate) fn py_payload_checksum<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let pieces: Vec<Bound<'py, PyAny>> =
        if data.is_instance_of::<pyo3::types::PyList>() || data.is_instance_of::<PyTuple>() {
            data.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![data.clone()]
        };
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for piece in &pieces {
        let arr = piece.cast::<numpy::PyArray1<u8>>().map_err(|_| {
            KvError::InvalidArgument(
                "payload_checksum: expected a 1-D uint8 NumPy array or a list of them".into(),
            )
        })?;
        // A read-only borrow: rust-numpy refuses it while a writable borrow exists. The hash
        // runs attached, on a contiguous view, and reads nothing past its length.
        let view = arr
            .try_readonly()
            .map_err(|e| KvError::InvalidArgument(format!("payload_checksum: {e}")))?;
        let bytes = view.as_slice().map_err(|_| {
            KvError::InvalidArgument("payload_checksum: every array must be contiguous".into())
        })?;
        hasher.update(bytes);
    }
    Ok(pyo3::types::PyBytes::new(
        py,
        &hasher.digest128().to_le_bytes(),
    ))
}

/// Op ids (`take_transfers` rows' `op`): non-negative integers.
fn op_ids_arg(op_ids: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    seq_ids_arg(op_ids, "op_ids")?
        .into_iter()
        .map(|id| {
            u64::try_from(id).map_err(|_| {
                PyErr::from(KvError::InvalidArgument(format!(
                    "op_ids: {id} is not an op id"
                )))
            })
        })
        .collect()
}
