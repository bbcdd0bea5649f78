//! `SchedulerConfig`: a frozen Python view of the core's validated config.
//!
//! Every field comes from the core's one declaration (`llmsched_core::config_fields!`):
//! the keyword arguments, the properties and their docstrings, `to_dict`, the
//! constructor's signature (`__signature__`, with the core's defaults) and the hash.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use llmsched_core::config::{FieldInfo, FieldKind, FieldValue};
use llmsched_core::{ConfigParams, KvCacheGroups, Policy, SchedulerConfig};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

use crate::convert::{bool_value, describe, float_value, int_value, type_name};
use crate::errors::{config_error, core_err};

fn field_names() -> String {
    ConfigParams::FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

fn find_field(py: Python<'_>, name: &str) -> PyResult<&'static FieldInfo> {
    ConfigParams::FIELDS
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| config_error(py, format!("{name}: not a SchedulerConfig field (fields: {})", field_names())))
}

/// A Python value as the field's kind, refused with `ConfigError` naming the field.
fn field_from_python(py: Python<'_>, field: &FieldInfo, value: &Bound<'_, PyAny>) -> PyResult<FieldValue> {
    let name = &field.name;
    Ok(match field.kind {
        FieldKind::Int => FieldValue::Int(int_value(py, value, name, config_error)?),
        FieldKind::Derived if value.is_none() => FieldValue::Derived(None),
        FieldKind::Derived => FieldValue::Derived(Some(int_value(py, value, name, config_error)?)),
        FieldKind::Bool => FieldValue::Bool(bool_value(py, value, name, config_error)?),
        FieldKind::Float => FieldValue::Float(float_value(py, value, name, config_error)?),
        FieldKind::Policy | FieldKind::Groups => {
            let text = value.cast::<PyString>().map_err(|_| {
                config_error(py, format!("{name}={}: must be a str, got {}", describe(value), type_name(value)))
            })?;
            let text = text.to_cow()?;
            match field.kind {
                FieldKind::Policy => FieldValue::Policy(Policy::parse(&text).map_err(core_err)?),
                _ => FieldValue::Groups(KvCacheGroups::parse(&text).map_err(core_err)?),
            }
        }
    })
}

fn field_to_python(py: Python<'_>, value: FieldValue) -> PyResult<Bound<'_, PyAny>> {
    Ok(match value {
        FieldValue::Int(v) | FieldValue::Derived(Some(v)) => v.into_pyobject(py)?.into_any(),
        FieldValue::Derived(None) => py.None().into_bound(py),
        FieldValue::Bool(v) => PyBool::new(py, v).to_owned().into_any(),
        FieldValue::Float(v) => v.into_pyobject(py)?.into_any(),
        FieldValue::Policy(v) => PyString::new(py, v.as_str()).into_any(),
        FieldValue::Groups(v) => PyString::new(py, &v.to_text()).into_any(),
    })
}

/// The constructor's signature, keyword-only fields with the core's defaults, set as the
/// class's `__signature__` (what `inspect.signature`, `help()` and stubtest read).
pub fn install_signature(py: Python<'_>, class: &Bound<'_, PyAny>) -> PyResult<()> {
    let inspect = py.import("inspect")?;
    let parameter = inspect.getattr("Parameter")?;
    let keyword_only = parameter.getattr("KEYWORD_ONLY")?;
    let defaults = ConfigParams::default();
    let mut parameters = Vec::with_capacity(ConfigParams::FIELDS.len());
    for field in ConfigParams::FIELDS {
        let kwargs = PyDict::new(py);
        if let Some(value) = defaults.get(field.name) {
            kwargs.set_item("default", field_to_python(py, value)?)?;
        }
        let annotation = match field.kind {
            FieldKind::Int => "int",
            FieldKind::Derived => "int | None",
            FieldKind::Bool => "bool",
            FieldKind::Float => "float",
            FieldKind::Policy | FieldKind::Groups => "str",
        };
        kwargs.set_item("annotation", annotation)?;
        parameters.push(parameter.call((field.name, &keyword_only), Some(&kwargs))?);
    }
    let signature = inspect.getattr("Signature")?.call1((parameters,))?;
    class.setattr("__signature__", signature)
}

/// The validated configuration of a scheduler. Immutable.
///
/// Every field is a keyword argument and a read-only property (see each property's
/// documentation); a derived field left to None reads as the value it derives.
/// ``replace(**changes)`` makes a new validated config.
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
                let field = find_field(py, &key)?;
                let value = field_from_python(py, field, &value)?;
                params.set(field.name, value).map_err(core_err)?;
            }
        }
        let config = SchedulerConfig::new(params).map_err(core_err)?;
        Ok(Self { inner: Arc::new(config) })
    }

    fn field_value<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.inner.resolved_value(name) {
            Some(value) => field_to_python(py, value),
            None => Err(find_field(py, name).err().unwrap_or_else(|| config_error(py, format!("{name}: no value")))),
        }
    }
}

/// The class's methods, and one property per field with the field's documentation.
macro_rules! py_config_methods {
    ($( $(#[doc = $doc:literal])+ $name:ident: $kind:ident $(($from:ident))? = $default:expr; )+) => {
        #[pymethods]
        impl PySchedulerConfig {
            #[new]
            #[pyo3(signature = (**kwargs))]
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
                for field in ConfigParams::FIELDS {
                    dict.set_item(field.name, self.field_value(py, field.name)?)?;
                }
                Ok(dict)
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let mut parts = Vec::with_capacity(ConfigParams::FIELDS.len());
                for field in ConfigParams::FIELDS {
                    parts.push(format!("{}={}", field.name, self.field_value(py, field.name)?.repr()?));
                }
                Ok(format!("SchedulerConfig({})", parts.join(", ")))
            }

            fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
                other.cast::<PySchedulerConfig>().is_ok_and(|o| o.get().inner == self.inner)
            }

            /// A diffusion LLM: nothing sampled (``num_sampled_tokens_per_step`` 0) but a
            /// canvas of ``num_speculative_tokens`` positions each step denoises, scheduled
            /// as drafts; the positions a step emits are its tokens.
            #[getter]
            fn is_diffusion(&self) -> bool {
                self.inner.is_diffusion()
            }

            /// The longest a request grows: ``max_model_len``, or less when the KV pool's
            /// ``num_gpu_blocks - 1`` usable blocks cannot hold a request that long (every
            /// KV-cache group counted; with a KV connector and drafts, a load of all its
            /// tokens beside a speculative step's blocks). A request stops there,
            /// ``FINISHED_LENGTH_CAPPED``, as at ``max_model_len``, and no step takes it
            /// past: a request alone always fits the pool. A longer prompt is refused at
            /// ``add_request``.
            #[getter]
            fn max_request_len(&self) -> i64 {
                self.inner.max_request_len()
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
                for field in ConfigParams::FIELDS {
                    if params.get(field.name) == Some(FieldValue::Derived(None)) {
                        dict.del_item(field.name)?;
                    }
                }
                let factory = partial.call((slf.get_type(),), Some(&dict))?;
                Ok((factory, ()))
            }

            $(
                #[getter]
                $(#[doc = $doc])+
                fn $name<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                    self.field_value(py, stringify!($name))
                }
            )+
        }
    };
}

llmsched_core::config_fields!(py_config_methods);
