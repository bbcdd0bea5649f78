//! An auxiliary-output connector as the core's `AuxOutputs` (see ``Scheduler.schedule``'s
//! ``aux_outputs``), and the view of the prefix cache it reads mid-step.

use std::sync::Mutex;

use llmsched_core::{AuxOutputs, BlockHash, CachedBlocks, Request};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;

use crate::convert::{describe, int_value, type_name};
use crate::errors::{internal_error, request_error};
use crate::output::PyRequest;
use crate::sources::PySource;

/// The prefix cache as it is at the point of a step where a connector is asked: which block
/// holds a hash. Given to the connector's callback, it answers only until that callback
/// returns (the step goes on changing the cache); between steps, ask
/// ``Scheduler.cached_block``.
#[pyclass(frozen, module = "llmsched._core", name = "CachedBlocks")]
pub struct PyCachedBlocks {
    cache: Mutex<Option<&'static dyn CachedBlocks>>,
}

/// Empties the view when the callback it was lent to returns (or unwinds).
struct Expire<'a, 'py>(&'a PyCachedBlocks, Python<'py>);

impl Drop for Expire<'_, '_> {
    fn drop(&mut self) {
        // Waits for a read in progress on another thread, letting it take the GIL (a
        // poisoned lock still holds the value: it is cleared all the same).
        let mut cache = self.0.cache.lock_py_attached(self.1).unwrap_or_else(std::sync::PoisonError::into_inner);
        *cache = None;
    }
}

impl PyCachedBlocks {
    /// Runs `f` with a Python view of `cache`, which answers until `f` returns.
    fn lend<'py, R>(
        py: Python<'py>,
        cache: &dyn CachedBlocks,
        f: impl FnOnce(&Bound<'py, PyCachedBlocks>) -> PyResult<R>,
    ) -> PyResult<R> {
        // SAFETY: the view keeps the borrow only until `_expire` clears it, before this
        // function returns (on unwind too), and every read holds the view's lock, so none
        // outlives the borrow. `cache` is `Sync`, and the core does not change it while the
        // callback runs (the step waits for the callback).
        let cache: &'static dyn CachedBlocks = unsafe { std::mem::transmute::<&dyn CachedBlocks, _>(cache) };
        let view = Bound::new(py, PyCachedBlocks { cache: Mutex::new(Some(cache)) })?;
        let _expire = Expire(view.get(), py);
        f(&view)
    }
}

/// ``cached_block``'s arguments: ``block_hash``, a 128-bit hash as in
/// ``Request.block_hashes``, and ``group``, a KV-cache group's index (0 if None).
pub fn cached_block_args(
    py: Python<'_>,
    block_hash: &Bound<'_, PyAny>,
    group: Option<&Bound<'_, PyAny>>,
) -> PyResult<(BlockHash, usize)> {
    let hash = block_hash.extract::<u128>().map_err(|_| {
        request_error(
            py,
            format!(
                "block_hash={}: must be a non-negative 128-bit int, got {}",
                describe(block_hash),
                type_name(block_hash)
            ),
        )
    })?;
    let Some(group) = group else { return Ok((hash, 0)) };
    let index = int_value(py, group, &"group", request_error)?;
    let group = usize::try_from(index).map_err(|_| request_error(py, format!("group={index}: must be >= 0")))?;
    Ok((hash, group))
}

#[pymethods]
impl PyCachedBlocks {
    /// The KV block cached under ``block_hash`` (llmsched's 128-bit hash, as in
    /// ``Request.block_hashes``) in KV-cache group ``group`` at this point of the step, or
    /// None (also in a group the pool does not have). ``InvalidRequestError`` once the
    /// callback this view was given to has returned.
    #[pyo3(signature = (block_hash, group=None))]
    fn cached_block(
        &self,
        py: Python<'_>,
        block_hash: &Bound<'_, PyAny>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u32>> {
        let (hash, group) = cached_block_args(py, block_hash, group)?;
        let cache = self
            .cache
            .lock_py_attached(py)
            .map_err(|_| internal_error(py, "a CachedBlocks lock is poisoned".into()))?;
        match *cache {
            Some(cache) => Ok(cache.cached_block(hash, group)),
            None => Err(request_error(
                py,
                "CachedBlocks: a view of the prefix cache at one point of a step, read only during the \
                 callback it was given to, which has returned (between steps, ask Scheduler.cached_block)"
                    .into(),
            )),
        }
    }
}

/// A Python object as the core's auxiliary-output connector. The first error it meets is
/// kept for the caller to raise; from then on in the call no prefix-cache hit and no
/// external token is kept, and no preemption or finish is told.
pub struct PyAuxOutputs<'a, 'py>(pub PySource<'a, 'py>);

/// An answer as an int (an error names the call).
fn int_answer(py: Python<'_>, answer: &Bound<'_, PyAny>, field: &str) -> PyResult<i64> {
    int_value(py, answer, &field, request_error)
}

impl AuxOutputs for PyAuxOutputs<'_, '_> {
    fn max_cache_hit(&mut self, request: &Request, cache: &dyn CachedBlocks) -> i64 {
        let field = || format!("aux_outputs.max_cache_hit({:?})", request.id());
        self.0
            .ask(
                &field,
                |source| {
                    PyCachedBlocks::lend(source.py(), cache, |view| {
                        source.call_method1(intern!(source.py(), "max_cache_hit"), (PyRequest::snapshot(request), view))
                    })
                },
                int_answer,
            )
            .unwrap_or(0)
    }

    fn cap_external_hit(
        &mut self,
        request: &Request,
        num_local: i64,
        num_external: i64,
        cache: &dyn CachedBlocks,
    ) -> i64 {
        let field = || format!("aux_outputs.cap_external_hit({:?}, {num_local}, {num_external})", request.id());
        self.0
            .ask(
                &field,
                |source| {
                    PyCachedBlocks::lend(source.py(), cache, |view| {
                        source.call_method1(
                            intern!(source.py(), "cap_external_hit"),
                            (PyRequest::snapshot(request), num_local, num_external, view),
                        )
                    })
                },
                int_answer,
            )
            .unwrap_or(0)
    }

    fn request_finished(&mut self, request: &Request, cache: &dyn CachedBlocks) {
        self.0.tell(|source| {
            PyCachedBlocks::lend(source.py(), cache, |view| {
                source.call_method1(intern!(source.py(), "request_finished"), (PyRequest::snapshot(request), view))
            })
        });
    }
}
