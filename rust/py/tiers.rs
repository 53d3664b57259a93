//! Conversions for the lower tiers' bindings: the tier list and store policy of the constructor,
//! transfer batches out, restored pages in.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{count_arg, float_arg, int_arg, namespace_arg, opt_arg, str_arg};
use crate::error::KvError;
use crate::manager::{StorePolicy, TierConfig, TransferBatch, ValueModel};

/// Default bandwidth of a tier by name, GB/s (a load costs bytes / bandwidth in the `value`
/// policy): host DRAM over PCIe 5 25, local NVMe 5, a remote store 1, anything else 10.
fn default_bandwidth(name: &str) -> f64 {
    match name {
        "host" => 25.0,
        "disk" => 5.0,
        "remote" => 1.0,
        _ => 10.0,
    }
}

/// `lower_tiers`: a sequence of `(name, num_slots)` / `(name, num_slots, bandwidth_gbps)`, or of
/// tier objects with `name`, `num_slots` and optionally `bandwidth_gbps` attributes.
pub(crate) fn tier_configs(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<TierConfig>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let bad = || {
        KvError::InvalidArgument(
            "lower_tiers must be a list of (name, num_slots[, bandwidth_gbps]) tuples or tier \
             objects (HostTier, DiskTier)"
                .into(),
        )
    };
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(bad().into());
    }
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| bad())? {
        let item = item?;
        let (name, slots, bw) = if let Ok(t) = item.cast::<pyo3::types::PyTuple>() {
            if !(2..=3).contains(&t.len()) {
                return Err(bad().into());
            }
            (
                t.get_item(0)?,
                t.get_item(1)?,
                if t.len() == 3 {
                    Some(t.get_item(2)?)
                } else {
                    None
                },
            )
        } else if item.hasattr("num_slots")? && item.hasattr("name")? {
            let bw = item.getattr("bandwidth_gbps").ok().filter(|b| !b.is_none());
            (item.getattr("name")?, item.getattr("num_slots")?, bw)
        } else {
            return Err(bad().into());
        };
        let name = str_arg(&name, "a lower tier's name")?;
        let num_slots = count_arg(&slots, "a lower tier's num_slots")?;
        let bandwidth_gbps = match bw {
            Some(b) => float_arg(&b, "a lower tier's bandwidth_gbps")?,
            None => default_bandwidth(&name),
        };
        out.push(TierConfig {
            name,
            num_slots,
            bandwidth_gbps,
        });
    }
    Ok(out)
}

/// `store_policy` (`"all"`, `"selective"`, `"value"`) and its `store_options` dict.
pub(crate) fn store_policy(
    policy: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyAny>>,
) -> PyResult<StorePolicy> {
    let name =
        opt_arg(policy, |p| str_arg(p, "store_policy"))?.unwrap_or_else(|| "selective".into());
    let options = match options.filter(|o| !o.is_none()) {
        None => None,
        Some(o) => Some(
            o.cast::<PyDict>()
                .map_err(|_| KvError::InvalidArgument("store_options must be a dict".into()))?,
        ),
    };
    let allowed: &[&str] = match name.as_str() {
        "all" => &[],
        "selective" => &["min_hits", "min_priority"],
        "value" => &[
            "page_bytes",
            "prefill_us_per_token",
            "attention_us_per_token_per_1k",
            "prior_hits",
            "prior_misses",
            "depth_scale_tokens",
        ],
        other => {
            return Err(KvError::InvalidArgument(format!(
                "store_policy must be 'all', 'selective' or 'value', got {other:?}"
            ))
            .into())
        }
    };
    let get = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(match &options {
            Some(d) => d.get_item(key)?,
            None => None,
        })
    };
    if let Some(d) = &options {
        for k in d.keys() {
            let k = str_arg(&k, "a store_options key")?;
            if !allowed.contains(&k.as_str()) {
                return Err(KvError::InvalidArgument(format!(
                    "store_options: {k:?} is not an option of store_policy {name:?} (options: {allowed:?})"
                ))
                .into());
            }
        }
    }
    Ok(match name.as_str() {
        "all" => StorePolicy::All,
        "selective" => {
            let StorePolicy::Selective {
                mut min_hits,
                mut min_priority,
            } = StorePolicy::default()
            else {
                unreachable!("the default policy is selective")
            };
            if let Some(v) = get("min_hits")? {
                min_hits = count_arg(&v, "store_options['min_hits']")? as u64;
            }
            if let Some(v) = get("min_priority")? {
                min_priority = int_arg(&v, "store_options['min_priority']", "int32")?;
            }
            StorePolicy::Selective {
                min_hits,
                min_priority,
            }
        }
        _ => {
            let mut m = ValueModel::default();
            for (key, field) in [
                ("page_bytes", &mut m.page_bytes),
                ("prefill_us_per_token", &mut m.prefill_us_per_token),
                (
                    "attention_us_per_token_per_1k",
                    &mut m.attention_us_per_token_per_1k,
                ),
                ("prior_hits", &mut m.prior_hits),
                ("prior_misses", &mut m.prior_misses),
                ("depth_scale_tokens", &mut m.depth_scale_tokens),
            ] {
                if let Some(v) = get(key)? {
                    *field = float_arg(&v, &format!("store_options[{key:?}]"))?;
                }
            }
            StorePolicy::Value(m)
        }
    })
}

fn keys_2d<'py>(
    py: Python<'py>,
    keys: impl Iterator<Item = [u8; 16]>,
    n: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let flat: Vec<u8> = keys.flatten().collect();
    Ok(PyArray1::from_vec(py, flat).reshape([n, 16])?.into_any())
}

/// The `kvcore.manager.TransferBatch` of a core batch.
pub(crate) fn batch_to_python<'py>(
    py: Python<'py>,
    class: &Bound<'py, PyAny>,
    batch: TransferBatch,
    page_size: usize,
    tier_names: Vec<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let s = &batch.stores;
    let l = &batch.loads;
    let i32s = |v: Vec<i32>| PyArray1::from_vec(py, v).into_any();
    let tokens: Vec<u32> = s.iter().flat_map(|r| r.tokens.iter().copied()).collect();
    let namespaces = PyList::new(py, s.iter().map(|r| r.namespace.clone()))?;
    let args: Vec<Bound<'py, PyAny>> = vec![
        PyArray1::from_vec(py, s.iter().map(|r| r.op as i64).collect()).into_any(),
        i32s(s.iter().map(|r| r.tier as i32).collect()),
        i32s(s.iter().map(|r| r.page as i32).collect()),
        i32s(s.iter().map(|r| r.slot as i32).collect()),
        keys_2d(py, s.iter().map(|r| r.key), s.len())?,
        keys_2d(py, s.iter().map(|r| r.parent_key), s.len())?,
        PyArray1::from_vec(py, tokens)
            .reshape([s.len(), page_size])?
            .into_any(),
        namespaces.into_any(),
        PyArray1::from_vec(py, l.iter().map(|r| r.op as i64).collect()).into_any(),
        i32s(l.iter().map(|r| r.tier as i32).collect()),
        i32s(l.iter().map(|r| r.slot as i32).collect()),
        i32s(l.iter().map(|r| r.page as i32).collect()),
        keys_2d(py, l.iter().map(|r| r.key), l.len())?,
        pyo3::types::PyTuple::new(py, tier_names)?.into_any(),
    ];
    super::new_named_tuple(class, pyo3::types::PyTuple::new(py, args)?)
}

/// A namespace as `restore_tier` and the transfer rows name it (None: default).
pub(crate) fn namespace_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    namespace_arg(Some(obj))
}

/// `(name, options)` of a store policy: what `store_policy(name, options)` parses back to it.
pub(crate) fn store_policy_view<'py>(
    py: Python<'py>,
    policy: &StorePolicy,
) -> PyResult<(String, Bound<'py, PyDict>)> {
    let d = PyDict::new(py);
    let name = match policy {
        StorePolicy::All => "all",
        StorePolicy::Selective {
            min_hits,
            min_priority,
        } => {
            d.set_item("min_hits", *min_hits)?;
            d.set_item("min_priority", *min_priority)?;
            "selective"
        }
        StorePolicy::Value(m) => {
            d.set_item("page_bytes", m.page_bytes)?;
            d.set_item("prefill_us_per_token", m.prefill_us_per_token)?;
            d.set_item(
                "attention_us_per_token_per_1k",
                m.attention_us_per_token_per_1k,
            )?;
            d.set_item("prior_hits", m.prior_hits)?;
            d.set_item("prior_misses", m.prior_misses)?;
            d.set_item("depth_scale_tokens", m.depth_scale_tokens)?;
            "value"
        }
    };
    Ok((name.to_string(), d))
}
