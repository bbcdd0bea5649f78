//! `SchedulerConfig`: a frozen Python view of the core's validated config.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use llmsched_core::{ConfigParams, Policy, SchedulerConfig};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::convert::{bool_value, float_value, int_value, type_name};
use crate::errors::{config_error, core_err};

const FIELDS: [&str; 19] = [
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_num_scheduled_tokens",
    "max_num_active_seqs",
    "block_size",
    "num_gpu_blocks",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "num_speculative_tokens",
    "num_lookahead_tokens",
    "max_num_new_slots_for_drafting",
    "num_sampled_tokens_per_step",
    "async_scheduling",
    "watermark",
    "scheduler_reserve_full_isl",
    "enable_prefix_caching",
    "policy",
];

fn apply(py: Python<'_>, params: &mut ConfigParams, field: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let int = |v: &Bound<'_, PyAny>| int_value(py, v, &field, config_error);
    let flag = |v: &Bound<'_, PyAny>| bool_value(py, v, &field, config_error);
    match field {
        "max_model_len" => params.max_model_len = int(value)?,
        "max_num_seqs" => params.max_num_seqs = int(value)?,
        "max_num_batched_tokens" => params.max_num_batched_tokens = int(value)?,
        "max_num_scheduled_tokens" => {
            params.max_num_scheduled_tokens = if value.is_none() { None } else { Some(int(value)?) }
        }
        "max_num_active_seqs" => params.max_num_active_seqs = if value.is_none() { None } else { Some(int(value)?) },
        "block_size" => params.block_size = int(value)?,
        "num_gpu_blocks" => params.num_gpu_blocks = int(value)?,
        "enable_chunked_prefill" => params.enable_chunked_prefill = flag(value)?,
        "long_prefill_token_threshold" => params.long_prefill_token_threshold = int(value)?,
        "long_prefill_token_threshold_adaptive" => params.long_prefill_token_threshold_adaptive = flag(value)?,
        "num_speculative_tokens" => params.num_speculative_tokens = int(value)?,
        "num_lookahead_tokens" => params.num_lookahead_tokens = int(value)?,
        "max_num_new_slots_for_drafting" => params.max_num_new_slots_for_drafting = int(value)?,
        "num_sampled_tokens_per_step" => params.num_sampled_tokens_per_step = int(value)?,
        "async_scheduling" => params.async_scheduling = flag(value)?,
        "watermark" => params.watermark = float_value(py, value, &field, config_error)?,
        "scheduler_reserve_full_isl" => params.scheduler_reserve_full_isl = flag(value)?,
        "enable_prefix_caching" => params.enable_prefix_caching = flag(value)?,
        "policy" => {
            let text = value.cast::<PyString>().map_err(|_| {
                config_error(
                    py,
                    format!(
                        "policy={}: must be a str, got {}",
                        value.repr().map(|r| r.to_string()).unwrap_or_default(),
                        type_name(value)
                    ),
                )
            })?;
            params.policy = Policy::parse(&text.to_cow()?).map_err(core_err)?;
        }
        other => {
            return Err(config_error(
                py,
                format!("{other}: not a SchedulerConfig field (fields: {})", FIELDS.join(", ")),
            ))
        }
    }
    Ok(())
}

/// The validated configuration of a scheduler. Immutable.
///
/// This object is the one home of ``max_model_len``: the scheduler, the
/// simulated runner and the engine all read it from here.
#[pyclass(frozen, module = "llmsched", name = "SchedulerConfig")]
pub struct PySchedulerConfig {
    pub inner: Arc<SchedulerConfig>,
}

impl PySchedulerConfig {
    fn build(py: Python<'_>, mut params: ConfigParams, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        if let Some(kwargs) = kwargs {
            for (key, value) in kwargs.iter() {
                let key = key.cast::<PyString>()?.to_cow()?.into_owned();
                apply(py, &mut params, &key, &value)?;
            }
        }
        let config = SchedulerConfig::new(params).map_err(core_err)?;
        Ok(Self { inner: Arc::new(config) })
    }

    fn field_value<'py>(&self, py: Python<'py>, field: &str) -> PyResult<Bound<'py, PyAny>> {
        let c = &self.inner;
        Ok(match field {
            "max_model_len" => c.max_model_len().into_pyobject(py)?.into_any(),
            "max_num_seqs" => c.max_num_seqs().into_pyobject(py)?.into_any(),
            "max_num_batched_tokens" => c.max_num_batched_tokens().into_pyobject(py)?.into_any(),
            "max_num_scheduled_tokens" => c.max_num_scheduled_tokens().into_pyobject(py)?.into_any(),
            "max_num_active_seqs" => c.max_num_active_seqs().into_pyobject(py)?.into_any(),
            "block_size" => c.block_size().into_pyobject(py)?.into_any(),
            "num_gpu_blocks" => c.num_gpu_blocks().into_pyobject(py)?.into_any(),
            "enable_chunked_prefill" => pyo3::types::PyBool::new(py, c.enable_chunked_prefill()).to_owned().into_any(),
            "long_prefill_token_threshold" => c.long_prefill_token_threshold().into_pyobject(py)?.into_any(),
            "long_prefill_token_threshold_adaptive" => {
                pyo3::types::PyBool::new(py, c.long_prefill_token_threshold_adaptive()).to_owned().into_any()
            }
            "num_speculative_tokens" => c.num_speculative_tokens().into_pyobject(py)?.into_any(),
            "num_lookahead_tokens" => c.num_lookahead_tokens().into_pyobject(py)?.into_any(),
            "max_num_new_slots_for_drafting" => c.max_num_new_slots_for_drafting().into_pyobject(py)?.into_any(),
            "num_sampled_tokens_per_step" => c.num_sampled_tokens_per_step().into_pyobject(py)?.into_any(),
            "async_scheduling" => pyo3::types::PyBool::new(py, c.async_scheduling()).to_owned().into_any(),
            "watermark" => c.watermark().into_pyobject(py)?.into_any(),
            "scheduler_reserve_full_isl" => {
                pyo3::types::PyBool::new(py, c.scheduler_reserve_full_isl()).to_owned().into_any()
            }
            "enable_prefix_caching" => pyo3::types::PyBool::new(py, c.enable_prefix_caching()).to_owned().into_any(),
            "policy" => PyString::new(py, c.policy().as_str()).into_any(),
            other => return Err(config_error(py, format!("{other}: not a SchedulerConfig field"))),
        })
    }
}

#[pymethods]
impl PySchedulerConfig {
    #[new]
    #[pyo3(signature = (**kwargs), text_signature = "(*, max_model_len=2048, max_num_seqs=128, \
        max_num_batched_tokens=2048, max_num_scheduled_tokens=None, max_num_active_seqs=None, \
        block_size=16, num_gpu_blocks=10000, enable_chunked_prefill=True, \
        long_prefill_token_threshold=0, long_prefill_token_threshold_adaptive=False, \
        num_speculative_tokens=0, num_lookahead_tokens=0, max_num_new_slots_for_drafting=0, \
        num_sampled_tokens_per_step=1, async_scheduling=True, watermark=0.0, \
        scheduler_reserve_full_isl=True, enable_prefix_caching=True, policy='fcfs')")]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::build(py, ConfigParams::default(), kwargs)
    }

    /// A new validated config with ``changes`` applied.
    #[pyo3(signature = (**changes))]
    fn replace(&self, py: Python<'_>, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::build(py, self.inner.params().clone(), changes)
    }

    /// Every field with its resolved value.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for field in FIELDS {
            dict.set_item(field, self.field_value(py, field)?)?;
        }
        Ok(dict)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = Vec::with_capacity(FIELDS.len());
        for field in FIELDS {
            parts.push(format!("{field}={}", self.field_value(py, field)?.repr()?));
        }
        Ok(format!("SchedulerConfig({})", parts.join(", ")))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PySchedulerConfig>().is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.inner.hash(&mut hasher);
        hasher.finish()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, ())> {
        // Rebuilt through the validating constructor: functools.partial(SchedulerConfig, **fields)().
        let partial = py.import("functools")?.getattr("partial")?;
        let params = slf.get().inner.params();
        let dict = slf.get().to_dict(py)?;
        // Keep derived fields derived, so the copy derives them the same way.
        if params.max_num_scheduled_tokens.is_none() {
            dict.del_item("max_num_scheduled_tokens")?;
        }
        if params.max_num_active_seqs.is_none() {
            dict.del_item("max_num_active_seqs")?;
        }
        let factory = partial.call((slf.get_type(),), Some(&dict))?;
        Ok((factory, ()))
    }

    #[getter]
    fn max_model_len(&self) -> i64 {
        self.inner.max_model_len()
    }
    #[getter]
    fn max_num_seqs(&self) -> usize {
        self.inner.max_num_seqs()
    }
    #[getter]
    fn max_num_batched_tokens(&self) -> i64 {
        self.inner.max_num_batched_tokens()
    }
    #[getter]
    fn max_num_scheduled_tokens(&self) -> i64 {
        self.inner.max_num_scheduled_tokens()
    }
    #[getter]
    fn max_num_active_seqs(&self) -> usize {
        self.inner.max_num_active_seqs()
    }
    #[getter]
    fn block_size(&self) -> i64 {
        self.inner.block_size()
    }
    #[getter]
    fn num_gpu_blocks(&self) -> usize {
        self.inner.num_gpu_blocks()
    }
    #[getter]
    fn enable_chunked_prefill(&self) -> bool {
        self.inner.enable_chunked_prefill()
    }
    #[getter]
    fn long_prefill_token_threshold(&self) -> i64 {
        self.inner.long_prefill_token_threshold()
    }
    #[getter]
    fn long_prefill_token_threshold_adaptive(&self) -> bool {
        self.inner.long_prefill_token_threshold_adaptive()
    }
    #[getter]
    fn num_speculative_tokens(&self) -> i64 {
        self.inner.num_speculative_tokens()
    }
    #[getter]
    fn num_lookahead_tokens(&self) -> i64 {
        self.inner.num_lookahead_tokens()
    }
    #[getter]
    fn max_num_new_slots_for_drafting(&self) -> i64 {
        self.inner.max_num_new_slots_for_drafting()
    }
    #[getter]
    fn num_sampled_tokens_per_step(&self) -> i64 {
        self.inner.num_sampled_tokens_per_step()
    }
    #[getter]
    fn async_scheduling(&self) -> bool {
        self.inner.async_scheduling()
    }
    #[getter]
    fn watermark(&self) -> f64 {
        self.inner.watermark()
    }
    #[getter]
    fn scheduler_reserve_full_isl(&self) -> bool {
        self.inner.scheduler_reserve_full_isl()
    }
    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.inner.enable_prefix_caching()
    }
    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy().as_str()
    }
}
