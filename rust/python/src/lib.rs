//! The Python bindings of llmsched (`llmsched._core`). Conversion only: every
//! decision is made in `llmsched-core`.
//!
//! Nothing a caller passes may panic here: a panic would reach Python as
//! `PanicException`, a `BaseException` that `except Exception` misses. So the
//! crate denies the lints below; conversions return errors instead.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::unreachable, clippy::todo)]
#![deny(clippy::unimplemented)]

mod aux_outputs;
mod config;
mod convert;
mod errors;
mod ids;
mod objects;
mod output;
mod replay;
mod scheduler;
mod sources;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    use super::*;

    #[pymodule_export]
    use crate::aux_outputs::PyCachedBlocks;
    #[pymodule_export]
    use crate::config::PySchedulerConfig;
    #[pymodule_export]
    use crate::output::{PyRequest, PyRequestOutput, PyRequestOutputs, PySchedulerOutput};
    #[pymodule_export]
    use crate::replay::{prompt_token_ids, step_shape, PyReplay};
    #[pymodule_export]
    use crate::scheduler::PyScheduler;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        let e = errors::exceptions(py)?;
        m.add("LlmschedError", e.base.clone_ref(py))?;
        m.add("ConfigError", e.config.clone_ref(py))?;
        m.add("InvalidRequestError", e.invalid_request.clone_ref(py))?;
        m.add("DuplicateRequestError", e.duplicate_request.clone_ref(py))?;
        m.add("UnknownRequestError", e.unknown_request.clone_ref(py))?;
        m.add("OutputMismatchError", e.output_mismatch.clone_ref(py))?;
        m.add("InvariantError", e.invariant.clone_ref(py))?;
        m.add("ReentrantCallError", e.reentrant_call.clone_ref(py))?;
        m.add("InternalError", e.internal.clone_ref(py))?;
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("BATCH_QUEUE_SIZE", llmsched_core::replay::BATCH_QUEUE_SIZE)?;
        m.add("MAX_IDLE_STEPS", llmsched_core::replay::MAX_IDLE_STEPS)?;
        m.add("MOONCAKE_BLOCK_TOKENS", llmsched_core::replay::tokens::MOONCAKE_BLOCK_TOKENS)?;
        m.add("COST_TERMS", pyo3::types::PyTuple::new(py, llmsched_core::replay::cost::StepCost::TERMS)?)?;
        m.add("REQUEST_STATUSES", crate::output::request_statuses(py)?)?;
        crate::config::install_signature(py, py.get_type::<PySchedulerConfig>().as_any())?;
        Ok(())
    }
}
