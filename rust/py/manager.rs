//! Bindings of [`crate::manager::KVCacheManager`] as `kvcore.KVCacheManager`.

use std::time::Instant;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PySlice};

use super::convert::{count_arg, page_ids, tokens};
use super::error::kv_exception;
use crate::eviction::EvictionPolicy;
use crate::manager::{KVCacheManager, ManagerConfig, SeqId};

static PAGE_TABLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static CACHE_STATS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static METRICS_TEXT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

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

/// The KV-cache manager an engine's scheduler talks to every step (see `kvcore.manager` and SPEC.md).
#[pyclass(name = "KVCacheManager", module = "kvcore._kvcore", frozen)]
pub(crate) struct PyKVCacheManager {
    inner: KVCacheManager,
    /// Injected clock (seconds, float) for TTL tests; None: a monotonic clock.
    clock: Option<Py<PyAny>>,
    epoch: Instant,
}

impl PyKVCacheManager {
    /// Microseconds on the manager's clock.
    fn now(&self, py: Python<'_>) -> PyResult<u64> {
        match &self.clock {
            None => Ok(self.epoch.elapsed().as_micros() as u64),
            Some(clock) => {
                let seconds: f64 = clock.bind(py).call0()?.extract()?;
                if !seconds.is_finite() || seconds < 0.0 {
                    return Err(kv_exception(
                        py,
                        "InvalidArgumentError",
                        format!("clock returned {seconds}"),
                    ));
                }
                Ok((seconds * 1e6) as u64)
            }
        }
    }
}

fn seconds_to_micros(py: Python<'_>, seconds: f64, name: &str) -> PyResult<u64> {
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(kv_exception(
            py,
            "InvalidArgumentError",
            format!("{name} must be a finite number >= 0, got {seconds}"),
        ));
    }
    Ok((seconds * 1e6) as u64)
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(signature = (num_pages, page_size = None, eviction = "lru", *, pin_budget_pages = None, clock = None))]
    fn new(
        py: Python<'_>,
        num_pages: &Bound<'_, PyAny>,
        page_size: Option<&Bound<'_, PyAny>>,
        eviction: &str,
        pin_budget_pages: Option<&Bound<'_, PyAny>>,
        clock: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let policy: EvictionPolicy = eviction.parse().map_err(|_| {
            kv_exception(
                py,
                "InvalidArgumentError",
                format!("eviction must be 'lru', 'lfu' or 'priority', got {eviction:?}"),
            )
        })?;
        let config = ManagerConfig {
            num_pages: count_arg(num_pages, "num_pages")?,
            page_size: page_size
                .map(|p| count_arg(p, "page_size"))
                .transpose()?
                .unwrap_or(16),
            policy,
            pin_budget_pages: pin_budget_pages
                .map(|b| count_arg(b, "pin_budget_pages"))
                .transpose()?,
        };
        if let Some(clock) = &clock {
            if !clock.bind(py).is_callable() {
                return Err(kv_exception(
                    py,
                    "InvalidArgumentError",
                    "clock must be callable".into(),
                ));
            }
        }
        Ok(Self {
            inner: KVCacheManager::new(config)?,
            clock,
            epoch: Instant::now(),
        })
    }

    /// Admit `seq_id` with its prompt: the number of prompt tokens already cached, or None (nothing
    /// changed) if its pages cannot be found even after evicting everything evictable. With
    /// `cache_prompt=False` (chunked prefill) pages are shared only once `commit` says so.
    #[pyo3(signature = (seq_id, prompt_tokens, namespace = None, priority = 0, *, cache_prompt = true))]
    fn add_sequence(
        &self,
        py: Python<'_>,
        seq_id: SeqId,
        prompt_tokens: &Bound<'_, PyAny>,
        namespace: Option<&str>,
        priority: i32,
        cache_prompt: bool,
    ) -> PyResult<Option<usize>> {
        let prompt = tokens(prompt_tokens)?;
        let now = self.now(py)?;
        Ok(self.inner.add_sequence(
            seq_id,
            prompt.as_slice(),
            namespace,
            priority,
            cache_prompt,
            now,
        )?)
    }

    /// The engine computed the first `num_tokens` tokens of `seq_id`: cache their full pages.
    /// Returns the number of the sequence's tokens now cached.
    fn commit(
        &self,
        py: Python<'_>,
        seq_id: SeqId,
        num_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let n = count_arg(num_tokens, "num_tokens")?;
        let now = self.now(py)?;
        Ok(self.inner.commit(seq_id, n, now)?)
    }

    /// Reserve slots for generated tokens; False (nothing changed) if there is no room.
    fn append(
        &self,
        py: Python<'_>,
        seq_id: SeqId,
        new_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let new_tokens = tokens(new_tokens)?;
        let now = self.now(py)?;
        Ok(self.inner.append(seq_id, new_tokens.as_slice(), now)?)
    }

    /// `child_id` shares every page of `parent_id`.
    fn fork(&self, parent_id: SeqId, child_id: SeqId) -> PyResult<()> {
        Ok(self.inner.fork(parent_id, child_id)?)
    }

    /// Release a finished sequence: full pages stay cached, the partial page is freed.
    fn free_sequence(&self, seq_id: SeqId) -> PyResult<()> {
        Ok(self.inner.free_sequence(seq_id)?)
    }

    /// `PageTable(kv_indptr, kv_indices, kv_last_page_len)` (int32) of the listed sequences. With
    /// `out` (a `PageTable` of writable int32 buffers, reused from step to step), the table is
    /// written into it and views of the used prefixes are returned: nothing is allocated but the
    /// views.
    #[pyo3(signature = (seq_ids, out = None))]
    fn page_table<'py>(
        &self,
        py: Python<'py>,
        seq_ids: Vec<SeqId>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let page_table = python_attr(py, &PAGE_TABLE, "kvcore.manager", "PageTable")?;
        let Some(out) = out else {
            // Built under the manager's lock into Rust vectors, handed to NumPy without a copy.
            let table = self.inner.page_table(&seq_ids)?;
            let indptr = PyArray1::from_vec(py, table.kv_indptr);
            let indices = PyArray1::from_vec(py, table.kv_indices);
            let last = PyArray1::from_vec(py, table.kv_last_page_len);
            return page_table.call1((indptr, indices, last));
        };
        let buffer = |name: &str| -> PyResult<Bound<'py, PyArray1<i32>>> {
            out.getattr(name)?
                .cast_into::<PyArray1<i32>>()
                .map_err(|_| {
                    kv_exception(
                        py,
                        "InvalidDTypeError",
                        format!("out.{name} must be a 1-D int32 array"),
                    )
                })
        };
        let (indptr, indices, last) = (
            buffer("kv_indptr")?,
            buffer("kv_indices")?,
            buffer("kv_last_page_len")?,
        );
        let total = {
            let not_writable = |_| {
                kv_exception(
                    py,
                    "InvalidDTypeError",
                    "out buffers must be distinct, writable arrays".into(),
                )
            };
            let mut w_indptr = indptr.try_readwrite().map_err(not_writable)?;
            let mut w_indices = indices.try_readwrite().map_err(not_writable)?;
            let mut w_last = last.try_readwrite().map_err(not_writable)?;
            let contiguous = |_| {
                kv_exception(
                    py,
                    "InvalidDTypeError",
                    "out buffers must be contiguous".into(),
                )
            };
            self.inner.page_table_into(
                &seq_ids,
                w_indptr.as_slice_mut().map_err(contiguous)?,
                w_indices.as_slice_mut().map_err(contiguous)?,
                w_last.as_slice_mut().map_err(contiguous)?,
            )?
        };
        let batch = seq_ids.len();
        let view = |a: &Bound<'py, PyArray1<i32>>, n: usize| {
            a.get_item(PySlice::new(py, 0, n as isize, 1))
        };
        page_table.call1((
            view(&indptr, batch + 1)?,
            view(&indices, total)?,
            view(&last, batch)?,
        ))
    }

    /// The int64 slots (`page_id * page_size + offset`) of the last `num_tokens` tokens of `seq_id`.
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        seq_id: SeqId,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let n = count_arg(num_tokens, "num_tokens")?;
        Ok(PyArray1::from_vec(py, self.inner.slot_mapping(seq_id, n)?))
    }

    /// Evict up to `num_pages` cached pages; returns how many were evicted.
    fn evict(&self, py: Python<'_>, num_pages: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = count_arg(num_pages, "num_pages")?;
        let now = self.now(py)?;
        Ok(self.inner.evict(n, now)?)
    }

    /// Keep the cached prefix of `tokens` resident for `ttl_s` seconds; returns pages pinned.
    #[pyo3(signature = (tokens, ttl_s, namespace = None))]
    fn pin(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        ttl_s: f64,
        namespace: Option<&str>,
    ) -> PyResult<usize> {
        let ids = super::convert::tokens(tokens)?;
        let ttl = seconds_to_micros(py, ttl_s, "ttl_s")?;
        let now = self.now(py)?;
        Ok(self.inner.pin(ids.as_slice(), ttl, namespace, now)?)
    }

    /// Remove pins on the prefix of `tokens`; returns pages unpinned.
    #[pyo3(signature = (tokens, namespace = None))]
    fn unpin(&self, tokens: &Bound<'_, PyAny>, namespace: Option<&str>) -> PyResult<usize> {
        let ids = super::convert::tokens(tokens)?;
        Ok(self.inner.unpin(ids.as_slice(), namespace))
    }

    /// Cached tokens a lookup of `tokens` would find now (whole pages; no side effects).
    #[pyo3(signature = (tokens, namespace = None))]
    fn peek_prefix_len(
        &self,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&str>,
    ) -> PyResult<usize> {
        let ids = super::convert::tokens(tokens)?;
        Ok(self.inner.peek_prefix_len(ids.as_slice(), namespace))
    }

    /// `[n, 2]` int32 `(src_page, dst_page)` copies queued by copy-on-write since the last call.
    fn take_pending_copies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let pairs: Vec<Vec<i32>> = self
            .inner
            .take_pending_copies()
            .into_iter()
            .map(|(s, d)| vec![s as i32, d as i32])
            .collect();
        if pairs.is_empty() {
            return Ok(PyArray2::<i32>::zeros(py, [0, 2], false));
        }
        PyArray2::from_vec2(py, &pairs).map_err(|e| kv_exception(py, "KVCoreError", e.to_string()))
    }

    /// A `kvcore.CacheStats` snapshot (usage split and counters).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.stats(self.now(py)?);
        let kwargs = PyDict::new(py);
        kwargs.set_item("num_pages_total", s.num_pages_total)?;
        kwargs.set_item("num_pages_in_use", s.num_pages_in_use)?;
        kwargs.set_item("num_pages_cached", s.num_pages_cached)?;
        kwargs.set_item("num_pages_pinned", s.num_pages_pinned)?;
        kwargs.set_item("num_pages_free", s.num_pages_free)?;
        kwargs.set_item("num_sequences", s.num_sequences)?;
        kwargs.set_item("prefix_query_tokens", s.prefix_query_tokens)?;
        kwargs.set_item("prefix_hit_tokens", s.prefix_hit_tokens)?;
        kwargs.set_item("num_evicted_pages", s.num_evicted_pages)?;
        kwargs.set_item("num_cow_copies", s.num_cow_copies)?;
        kwargs.set_item("num_refused", s.num_refused)?;
        python_attr(py, &CACHE_STATS, "kvcore.manager", "CacheStats")?.call((), Some(&kwargs))
    }

    /// The stats in Prometheus text exposition format.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let stats = self.stats(py)?;
        python_attr(py, &METRICS_TEXT, "kvcore.metrics", "metrics_text")?
            .call1((stats,))?
            .extract()
    }

    /// Tokens of `seq_id`.
    fn seq_len(&self, seq_id: SeqId) -> PyResult<usize> {
        Ok(self.inner.seq_len(seq_id)?)
    }

    /// The page table of one sequence (int32 copy).
    fn seq_pages<'py>(
        &self,
        py: Python<'py>,
        seq_id: SeqId,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let pages: Vec<i32> = self
            .inner
            .seq_pages(seq_id)?
            .into_iter()
            .map(|p| p as i32)
            .collect();
        Ok(PyArray1::from_vec(py, pages))
    }

    /// Every page the prefix tree holds (int32, no particular order).
    fn cached_pages<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        PyArray1::from_vec(
            py,
            self.inner
                .cached_pages()
                .into_iter()
                .map(|p| p as i32)
                .collect(),
        )
    }

    /// Live sequence ids.
    fn seq_ids(&self) -> Vec<SeqId> {
        self.inner.seq_ids()
    }

    /// References held on `page` (the tree's and each sequence's).
    fn ref_count(&self, py: Python<'_>, page: i64) -> PyResult<u32> {
        let page = u32::try_from(page).map_err(|_| {
            let last = self.inner.num_pages() - 1;
            kv_exception(
                py,
                "InvalidPageError",
                format!("page {page} is out of range; valid pages are 1..={last}"),
            )
        })?;
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

    fn __contains__(&self, seq_id: &Bound<'_, PyAny>) -> bool {
        seq_id
            .extract::<SeqId>()
            .is_ok_and(|id| self.inner.contains(id))
    }

    fn __len__(&self) -> usize {
        self.inner.seq_ids().len()
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheManager(num_pages={}, page_size={})",
            self.inner.num_pages(),
            self.inner.page_size()
        )
    }
}
