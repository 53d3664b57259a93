//! Bindings of [`crate::allocator::PageAllocator`] as `kvcore.PageAllocator`.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::convert::{count_arg, new_page_array, page_arg, page_ids, DETACH_MIN_PAGES};
use crate::allocator::PageAllocator;
use crate::{KvError, KvResult, PageId};

/// Run `op` on a copy of the page ids in `pages`, detached from the interpreter for large batches
/// (the copy is ours, so Python threads may keep running and writing the caller's array).
fn with_page_ids(
    py: Python<'_>,
    pages: &Bound<'_, PyAny>,
    op: impl Fn(&[PageId]) -> KvResult<()> + Send + Sync,
) -> PyResult<()> {
    let ids = page_ids(pages)?;
    let ids: &[PageId] = ids.as_slice();
    if ids.len() >= DETACH_MIN_PAGES {
        super::detach(py, || op(ids))?;
    } else {
        op(ids)?;
    }
    Ok(())
}

/// A fixed pool of pages with per-page reference counts; lock-free and safe to share between threads.
#[pyclass(name = "PageAllocator", module = "kvcore._kvcore", frozen)]
pub(crate) struct PyPageAllocator {
    inner: PageAllocator,
}

#[pymethods]
impl PyPageAllocator {
    #[new]
    #[pyo3(signature = (num_pages, *, num_shards = None))]
    fn new(num_pages: &Bound<'_, PyAny>, num_shards: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let num_pages = count_arg(num_pages, "num_pages")?;
        let inner = match num_shards {
            Some(s) => PageAllocator::with_shards(num_pages, count_arg(s, "num_shards")?)?,
            None => PageAllocator::new(num_pages)?,
        };
        Ok(Self { inner })
    }

    /// `n` distinct pages (int32 array, each with one reference), or None when fewer are free.
    fn allocate<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let n = count_arg(n, "n")?;
        if n > self.inner.num_pages() - 1 {
            // Checked before creating the output so an absurd n never allocates memory.
            return Err(KvError::InvalidArgument(format!(
                "cannot allocate {n} pages from a pool of {} usable pages",
                self.inner.num_pages() - 1
            ))
            .into());
        }
        // SAFETY: `allocate_into` writes every element when it returns true; on false (or an
        // error) the array is dropped without being exposed.
        let (array, out) = unsafe { new_page_array(py, n) };
        let ok = if n >= DETACH_MIN_PAGES {
            super::detach(py, || self.inner.allocate_into(out))?
        } else {
            self.inner.allocate_into(out)?
        };
        Ok(ok.then_some(array))
    }

    /// Drop one reference per listed page; pages reaching zero return to the pool. All or nothing.
    fn free(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        with_page_ids(py, pages, |ids| self.inner.free(ids))
    }

    /// Add one reference per listed page (sharing). All or nothing.
    fn retain(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<()> {
        with_page_ids(py, pages, |ids| self.inner.retain(ids))
    }

    /// References held on `page` (0 when free).
    fn ref_count(&self, page: &Bound<'_, PyAny>) -> PyResult<u32> {
        let page = page_arg(page, self.inner.num_pages())?;
        Ok(self.inner.ref_count(page)?)
    }

    /// Free pages right now.
    #[getter]
    fn num_free(&self) -> usize {
        self.inner.num_free()
    }

    /// Pages in the pool, the null page 0 included.
    #[getter]
    fn num_pages(&self) -> usize {
        self.inner.num_pages()
    }

    /// Free-page stacks (threads pick one each; see the allocator's design notes).
    #[getter]
    fn num_shards(&self) -> usize {
        self.inner.num_shards()
    }

    fn __repr__(&self) -> String {
        format!(
            "PageAllocator(num_pages={}, num_free={})",
            self.inner.num_pages(),
            self.inner.num_free()
        )
    }
}
