//! Bindings of [`crate::remote::RespClient`] as `kvcore._kvcore.RespClient` (the remote tier's
//! Rust transport). Keys are copied while attached; the network runs detached, sending values from
//! and reading values into the caller's NumPy arrays under a rust-numpy borrow held for the whole
//! call (read-only for values, writable for the destination: any other borrow is refused
//! meanwhile). No Python object is touched while the interpreter is released.

use std::time::Duration;

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::convert::{bool_arg, bytes_arg, count_arg, float_arg, iter_arg, str_arg};
use crate::error::KvError;
use crate::remote::{KeyResult, RespClient};

/// A pipelined RESP client of one Redis server or of a Redis Cluster, every socket operation
/// bounded by `timeout_s`.
#[pyclass(name = "RespClient", module = "kvcore._kvcore", frozen)]
pub(crate) struct PyRespClient {
    inner: Mutex<RespClient>,
}

fn keys_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for (i, k) in iter_arg(obj, "keys")?.enumerate() {
        out.push(bytes_arg(&k?, &format!("keys[{i}]"))?);
    }
    Ok(out)
}

/// `(status int8[n], errors)`: 1 done, 0 absent (NX existed, missing key, false), 2 a value of
/// another length, -1 refused by the server (its error line), -2 connection failed or timed out.
fn results<'py>(
    py: Python<'py>,
    res: Vec<KeyResult>,
) -> PyResult<(Bound<'py, PyArray1<i8>>, Bound<'py, PyList>)> {
    let mut status = Vec::with_capacity(res.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(res.len());
    for r in res {
        let (s, e) = match r {
            KeyResult::Done(_) => (1, None),
            KeyResult::Absent => (0, None),
            KeyResult::WrongLength(n) => (2, Some(format!("value of {n} bytes"))),
            KeyResult::Refused(e) => (-1, Some(e)),
            KeyResult::Failed(e) => (-2, Some(e)),
        };
        status.push(s);
        errors.push(e);
    }
    Ok((PyArray1::from_vec(py, status), PyList::new(py, errors)?))
}

fn refs(keys: &[Vec<u8>]) -> Vec<&[u8]> {
    keys.iter().map(Vec::as_slice).collect()
}

#[pymethods]
impl PyRespClient {
    #[new]
    #[pyo3(
        signature = (nodes, cluster = None, timeout_s = None),
        text_signature = "(nodes, cluster=False, timeout_s=0.5)"
    )]
    fn new(
        py: Python<'_>,
        nodes: &Bound<'_, PyAny>,
        cluster: Option<&Bound<'_, PyAny>>,
        timeout_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut addrs = Vec::new();
        for (i, n) in iter_arg(nodes, "nodes")?.enumerate() {
            addrs.push(str_arg(&n?, &format!("nodes[{i}]"))?);
        }
        let cluster = match cluster {
            Some(c) if !c.is_none() => bool_arg(c, "cluster")?,
            _ => false,
        };
        let timeout = match timeout_s {
            Some(t) if !t.is_none() => float_arg(t, "timeout_s")?,
            _ => 0.5,
        };
        if !(timeout.is_finite() && timeout > 0.0 && timeout < 3600.0) {
            return Err(KvError::InvalidArgument(format!(
                "timeout_s must be in (0, 3600), got {timeout}"
            ))
            .into());
        }
        let timeout = Duration::from_secs_f64(timeout);
        let inner = super::detach(py, || RespClient::connect(&addrs, cluster, timeout))?;
        Ok(Self {
            inner: Mutex::new(inner),
        })
    }

    /// `SET key value [NX] [PX px_ms]` per row: `values` is a `[n, value_len]` uint8 array (one
    /// value per key). Returns `(status, errors)` (see the module docs).
    #[pyo3(
        signature = (keys, values, nx = None, px_ms = None),
        text_signature = "($self, keys, values, nx=True, px_ms=None)"
    )]
    fn set_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        nx: Option<&Bound<'py, PyAny>>,
        px_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyArray1<i8>>, Bound<'py, PyList>)> {
        let keys = keys_arg(keys)?;
        let arr = values.cast::<PyArray2<u8>>().map_err(|_| {
            KvError::InvalidArgument("values must be a 2-D uint8 array, one row per key".into())
        })?;
        if arr.shape()[0] != keys.len() {
            return Err(KvError::InvalidArgument(format!(
                "{} keys but {} value rows",
                keys.len(),
                arr.shape()[0]
            ))
            .into());
        }
        let row = arr.shape()[1];
        let nx = match nx {
            Some(v) if !v.is_none() => bool_arg(v, "nx")?,
            _ => true,
        };
        let px = match px_ms {
            Some(v) if !v.is_none() => Some(count_arg(v, "px_ms")? as u64),
            _ => None,
        };
        // A read-only borrow held across the call: rust-numpy refuses writable borrows of the
        // array meanwhile, and the values are sent from it without a copy.
        let view = arr
            .try_readonly()
            .map_err(|e| KvError::InvalidArgument(format!("values: {e}")))?;
        let data = view
            .as_slice()
            .map_err(|_| KvError::InvalidArgument("values must be contiguous".into()))?;
        let res = super::detach(py, || {
            let vals: Vec<&[u8]> = if row == 0 {
                vec![&[][..]; keys.len()]
            } else {
                data.chunks_exact(row).collect()
            };
            self.inner.lock().set_many(&refs(&keys), &vals, nx, px)
        });
        results(py, res)
    }

    /// `GET` each key into its row of `out` (`[n, value_len]` uint8, writable): a value of another
    /// length is not copied (status 2). Returns `(status, errors)`.
    fn get_into<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray1<i8>>, Bound<'py, PyList>)> {
        let keys = keys_arg(keys)?;
        let arr = out.cast::<PyArray2<u8>>().map_err(|_| {
            KvError::InvalidArgument("out must be a 2-D uint8 array, one row per key".into())
        })?;
        if arr.shape()[0] != keys.len() {
            return Err(KvError::InvalidArgument(format!(
                "{} keys but {} rows in out",
                keys.len(),
                arr.shape()[0]
            ))
            .into());
        }
        // A writable borrow held across the call (rust-numpy refuses any other borrow of the
        // array meanwhile): values are read from the socket straight into their rows.
        let mut view = arr
            .try_readwrite()
            .map_err(|e| KvError::InvalidArgument(format!("out: {e}")))?;
        let dst = view
            .as_slice_mut()
            .map_err(|_| KvError::InvalidArgument("out must be contiguous".into()))?;
        let res = super::detach(py, || self.inner.lock().get_into(&refs(&keys), dst));
        results(py, res)
    }

    /// `EXISTS` each key: `(status, errors)` (1 exists, 0 not).
    fn exists_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray1<i8>>, Bound<'py, PyList>)> {
        let keys = keys_arg(keys)?;
        let res = super::detach(py, || self.inner.lock().exists_many(&refs(&keys)));
        results(py, res)
    }

    /// `DEL` each key: `(status, errors)`.
    fn del_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray1<i8>>, Bound<'py, PyList>)> {
        let keys = keys_arg(keys)?;
        let res = super::detach(py, || self.inner.lock().del_many(&refs(&keys)));
        results(py, res)
    }
}
