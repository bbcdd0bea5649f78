//! The package's exceptions, and the one mapping from `CoreError` to them.
//!
//! The classes are built at import with two bases each (the package's own
//! `LlmschedError` and the builtin a caller expects: `ValueError`,
//! `KeyError`...), which `create_exception!` cannot express.

use llmsched_core::CoreError;
use pyo3::exceptions::{PyAssertionError, PyException, PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pub struct Exceptions {
    pub base: Py<PyType>,
    pub config: Py<PyType>,
    pub invalid_request: Py<PyType>,
    pub duplicate_request: Py<PyType>,
    pub unknown_request: Py<PyType>,
    pub output_mismatch: Py<PyType>,
    pub invariant: Py<PyType>,
    pub internal: Py<PyType>,
    pub reentrant_call: Py<PyType>,
}

static EXCEPTIONS: PyOnceLock<Exceptions> = PyOnceLock::new();

fn new_class<'py>(py: Python<'py>, name: &str, bases: Vec<Bound<'py, PyType>>, doc: &str) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", "llmsched")?;
    namespace.set_item("__doc__", doc)?;
    let class = py.get_type::<PyType>().call1((name, PyTuple::new(py, bases)?, namespace))?;
    Ok(class.cast_into::<PyType>()?.unbind())
}

/// The classes, built on first use. Building them can only fail if the interpreter
/// cannot create a class (out of memory); that error is returned, never a panic.
pub fn exceptions(py: Python<'_>) -> PyResult<&Exceptions> {
    EXCEPTIONS.get_or_try_init(py, || {
            let base = new_class(py, "LlmschedError", vec![py.get_type::<PyException>()], "Base class of every error llmsched raises on purpose.")?;
            let b = base.bind(py).clone();
            let value_error = py.get_type::<PyValueError>();
            let invalid_request = new_class(py, "InvalidRequestError", vec![b.clone(), value_error.clone()], "A bad argument to a request-level call (``add_request`` and friends).")?;
            Ok(Exceptions {
                config: new_class(py, "ConfigError", vec![b.clone(), value_error.clone()], "An invalid ``SchedulerConfig`` field or combination of fields.")?,
                duplicate_request: new_class(py, "DuplicateRequestError", vec![invalid_request.bind(py).clone()], "``add_request`` with the id of a request that is still live.")?,
                unknown_request: new_class(py, "UnknownRequestError", vec![b.clone(), py.get_type::<PyKeyError>()], "A request id that is not live (never added, or already finished).")?,
                output_mismatch: new_class(py, "OutputMismatchError", vec![b.clone(), value_error], "A runner output that does not match the scheduler output it answers, or a scheduler output applied twice or out of order.")?,
                invariant: new_class(py, "InvariantError", vec![b.clone(), py.get_type::<PyAssertionError>()], "``Scheduler.check_invariants`` found a broken invariant.")?,
                reentrant_call: new_class(py, "ReentrantCallError", vec![b.clone(), py.get_type::<PyRuntimeError>()], "A ``Scheduler`` method called while the same thread is already inside a call on that scheduler (from a finalizer, a signal handler or a callback). The inner call is refused and changes nothing; the outer call completes.")?,
                internal: new_class(py, "InternalError", vec![b, py.get_type::<PyRuntimeError>()], "A bug inside llmsched. The scheduler refuses further calls after one.")?,
                invalid_request,
                base,
            })
    })
}

/// `message` as an instance of the class `pick` chooses.
fn raise(py: Python<'_>, pick: impl FnOnce(&Exceptions) -> &Py<PyType>, message: String) -> PyErr {
    match exceptions(py) {
        Ok(e) => PyErr::from_type(pick(e).bind(py).clone(), message),
        Err(error) => error,
    }
}

/// `CoreError` as a Python exception. A newtype because neither `CoreError`
/// nor `PyErr` belongs to this crate.
pub struct PyCoreError(pub CoreError);

impl From<CoreError> for PyCoreError {
    fn from(error: CoreError) -> Self {
        Self(error)
    }
}

impl From<PyCoreError> for PyErr {
    fn from(error: PyCoreError) -> PyErr {
        Python::attach(|py| {
            let message = error.0.to_string();
            raise(
                py,
                |e| match &error.0 {
                    CoreError::InvalidConfig { .. } => &e.config,
                    CoreError::InvalidRequest { .. } => &e.invalid_request,
                    CoreError::DuplicateRequest { .. } => &e.duplicate_request,
                    CoreError::UnknownRequest { .. } => &e.unknown_request,
                    CoreError::OutputMismatch { .. } => &e.output_mismatch,
                    CoreError::Invariant { .. } => &e.invariant,
                },
                message,
            )
        })
    }
}

pub fn core_err(error: CoreError) -> PyErr {
    PyCoreError(error).into()
}

pub fn config_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, |e| &e.config, message)
}

pub fn request_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, |e| &e.invalid_request, message)
}

pub fn mismatch_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, |e| &e.output_mismatch, message)
}

pub fn reentrant_call_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, |e| &e.reentrant_call, message)
}

pub fn internal_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, |e| &e.internal, message)
}

/// What a caught panic says (its message, or "panic"), for the `InternalError` it becomes.
pub fn panic_reason(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}
