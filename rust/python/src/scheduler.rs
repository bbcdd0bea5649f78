//! `Scheduler`: locks the core, releases the GIL around its work, and
//! converts arguments and results. No scheduling logic lives here.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use llmsched_core::{
    AuxOutputs, Connectors, ExternalEncoderCache, ExternalKv, ExternalMatch, Handle, KvEvent, ListLimit, NewRequest,
    RequestRef, RequestStatus, RunnerOutput, Scheduler, SchedulerConfig, SessionInputAdded, Step,
};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyMemoryError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::aux_outputs::{cached_block_args, PyAuxOutputs};
use crate::config::PySchedulerConfig;
use crate::convert::{
    bool_value, float_value, for_each_bounded, int32_items, int_value, mm_input_list, push, reserved, token_list,
    type_name, Indexed,
};
use crate::errors::{
    config_error, core_err, internal_error, mismatch_error, panic_reason, reentrant_call_error, request_error,
};
use crate::ids::{IdBatch, StepIds};
use crate::objects::{new_int, new_list, new_str, new_str_list};
use crate::output::{frozen_array, OutputRow, PyRequest, PyRequestOutputs, PySchedulerOutput};
use crate::sources::PySource;

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_TOKEN: u8 = const { 0 };
}

/// A nonzero number unique among live threads: the address of a thread-local.
fn thread_token() -> usize {
    THREAD_TOKEN.with(|t| t as *const u8 as usize)
}

/// Clears the lock owner when a call ends, before its guard unlocks.
struct OwnerRelease<'a>(&'a AtomicUsize);

impl Drop for OwnerRelease<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

struct Inner {
    core: Scheduler,
    /// Each live request's Python id, by slab index, handed back every step
    /// as the same object (a reference-count bump, not a new string).
    py_ids: Vec<Option<(u32, Py<PyString>)>>,
    /// The same ids by object address: a caller handing those objects back (a runner's
    /// draft rows) is matched without hashing text. An address stays unique while
    /// `py_ids` holds the object, and leaves this map when `py_ids` lets it go.
    handle_by_address: rustc_hash::FxHashMap<usize, Handle>,
    /// The ids of requests finished since the last step, in the order they finished (the
    /// core's): taken out of `py_ids` and `handle_by_address` when they finish, handed out
    /// by the next step.
    unreported: Vec<(Handle, Py<PyString>)>,
    /// The last step's ids, edited into the next step's.
    batch: IdBatch,
    /// A step decided by a `schedule()` that could not build its output: the next
    /// `schedule()` delivers it before deciding another.
    undelivered: Option<Undelivered>,
    /// Set when a call panicked: the state may be half-updated, so refuse more calls.
    broken: Option<String>,
}

impl Inner {
    /// The request's cached Python id; `fallback` is only called if the cache
    /// has no entry for this handle (not expected, but never wrong).
    #[inline(always)]
    fn py_id<'py>(
        &self,
        py: Python<'py>,
        handle: Handle,
        fallback: impl FnOnce() -> String,
    ) -> PyResult<Bound<'py, PyString>> {
        match self.py_ids.get(handle.index as usize) {
            Some(Some((generation, id))) if *generation == handle.generation => Ok(id.bind(py).clone()),
            _ => new_str(py, &fallback()),
        }
    }

    /// Moves the requests the core finished since its finished list had `before` entries
    /// from the live ids to those the next step reports.
    fn retire_finished_since(&mut self, before: usize) {
        for &(handle, _) in &self.core.finished_since_last_step()[before..] {
            let Some(slot) = self.py_ids.get_mut(handle.index as usize) else { continue };
            if let Some((_, id)) = slot.take_if(|(generation, _)| *generation == handle.generation) {
                let address = id.as_ptr() as usize;
                if self.handle_by_address.get(&address) == Some(&handle) {
                    self.handle_by_address.remove(&address);
                }
                self.unreported.push((handle, id));
            }
        }
    }

    /// Starts loading the request's cached Python id object.
    #[inline(always)]
    fn prefetch_py_id(&self, handle: Handle) {
        if let Some(Some((_, id))) = self.py_ids.get(handle.index as usize) {
            llmsched_core::prefetch::prefetch(id.as_ptr());
        }
    }

    /// The live request a Python id names: by object (an id this scheduler handed out) or
    /// by its text. `field` names the argument for an error (an id that is not a str).
    fn live_handle(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        field: impl FnOnce() -> String,
    ) -> PyResult<Option<Handle>> {
        let by_object = self.handle_by_address.get(&(id.as_ptr() as usize));
        if let Some(handle) = by_object.and_then(|&h| self.core.live_handle(&RequestRef::Handle(h))) {
            return Ok(Some(handle));
        }
        let text = id
            .cast::<PyString>()
            .map_err(|_| request_error(py, format!("{}: must be a str, got {}", field(), type_name(id))))?
            .to_cow()?;
        Ok(self.core.live_handle(&RequestRef::Id(&text)))
    }

    /// The id of a request a step scheduled: live, or (a step delivered late) finished since,
    /// when `texts` holds the ids the step's requests had when it was decided.
    #[inline]
    fn step_py_id<'py>(
        &self,
        py: Python<'py>,
        handle: Handle,
        texts: Option<&StepTexts>,
    ) -> PyResult<Bound<'py, PyString>> {
        self.py_id(py, handle, || match self.core.request(handle) {
            Some(request) => request.id().to_string(),
            None => texts.and_then(|texts| texts.get(&handle)).map(|id| id.to_string()).unwrap_or_default(),
        })
    }

    /// Builds the Python view of a step the core decided: its id lists, then its columns,
    /// moved into numpy arrays. On error (Python out of memory) `step` is as it was, to be
    /// delivered by the next `schedule()`, and nothing of `self` has changed but the id
    /// batch (kept in step with `step`).
    fn build_output(
        &mut self,
        py: Python<'_>,
        uid: u64,
        step: &mut Step,
        texts: Option<&StepTexts>,
    ) -> PyResult<Py<PySchedulerOutput>> {
        // Out of `self` while it is edited: its id lookups read `self`.
        let mut batch = std::mem::take(&mut self.batch);
        let synced = batch.sync(py, &step.req_handles, |h| self.step_py_id(py, h, texts), |h| self.prefetch_py_id(h));
        self.batch = batch;
        synced?;
        let (entry_ids, req_ids) = self.batch.step_ids(py)?;
        let ids = |handles: &[Handle]| -> PyResult<Py<PyList>> {
            let ids = handles.iter().map(|&h| self.step_py_id(py, h, texts)).collect::<PyResult<Vec<_>>>()?;
            Ok(new_list(py, ids)?.unbind())
        };
        let new_req_ids = ids(&step.new_reqs)?;
        let resumed_req_ids = ids(&step.resumed_reqs)?;
        let rescheduled_req_ids = ids(&step.rescheduled_reqs)?;
        let preempted =
            step.preempted.iter().map(|(h, id)| self.py_id(py, *h, || id.to_string())).collect::<PyResult<Vec<_>>>()?;
        let preempted_req_ids = new_list(py, preempted)?.unbind();
        // The binding retired them in the order the core finished them.
        let mut unreported = self.unreported.iter().peekable();
        let finished = step
            .finished
            .iter()
            .map(|(handle, id)| match unreported.next_if(|(h, _)| h == handle) {
                Some((_, py_id)) => Ok(py_id.bind(py).clone()),
                None => new_str(py, id),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let reported = self.unreported.len() - unreported.len();
        let finished_req_ids = new_list(py, finished)?.unbind();
        let [num_scheduled_tokens, num_computed_tokens, num_spec_tokens, spec_token_ids, num_output_tokens, num_block_ids, block_ids, num_all_token_ids, all_token_ids, lora_ids, structured_output_rows, new_block_ids_to_zero, num_new_token_ids, new_token_ids, encoder_input_rows, encoder_input_ids, external_encoder_input_rows, external_encoder_input_ids, num_external_computed_tokens] =
            step_columns(py, step)?;
        let columns = [
            &num_scheduled_tokens,
            &num_computed_tokens,
            &num_spec_tokens,
            &spec_token_ids,
            &num_output_tokens,
            &num_block_ids,
            &block_ids,
            &num_all_token_ids,
            &all_token_ids,
            &lora_ids,
            &structured_output_rows,
            &new_block_ids_to_zero,
            &num_new_token_ids,
            &new_token_ids,
            &encoder_input_rows,
            &encoder_input_ids,
            &external_encoder_input_rows,
            &external_encoder_input_ids,
            &num_external_computed_tokens,
        ]
        .map(|column| column.clone_ref(py));
        let freed = step.freed_encoder_outputs.iter().map(|id| new_str(py, id)).collect::<PyResult<Vec<_>>>();
        let freed_encoder_outputs = match freed.and_then(|freed| new_list(py, freed)) {
            Ok(list) => list.unbind(),
            Err(error) => {
                restore_columns(py, step, &columns);
                return Err(error);
            }
        };
        let loads = step
            .kv_loads
            .iter()
            .map(|load| {
                (new_str(py, &load.request_id)?, load.num_external_tokens, load.num_admitted_before).into_pyobject(py)
            })
            .collect::<PyResult<Vec<_>>>();
        let kv_loads = match loads.and_then(|loads| new_list(py, loads)) {
            Ok(list) => list.unbind(),
            Err(error) => {
                restore_columns(py, step, &columns);
                return Err(error);
            }
        };
        let output = PySchedulerOutput {
            scheduler_uid: uid,
            step_id: step.step_id,
            req_ids,
            entry_ids: Arc::new(entry_ids),
            num_scheduled_tokens,
            num_computed_tokens,
            num_spec_tokens,
            spec_token_ids,
            num_output_tokens,
            num_block_ids,
            block_ids,
            num_all_token_ids,
            all_token_ids,
            lora_ids,
            structured_output_rows,
            new_block_ids_to_zero,
            num_new_token_ids,
            new_token_ids,
            encoder_input_rows,
            encoder_input_ids,
            external_encoder_input_rows,
            external_encoder_input_ids,
            num_external_computed_tokens,
            freed_encoder_outputs,
            kv_loads,
            pending_structured_output_tokens: step.pending_structured_output_tokens,
            drafts_unused: step.drafts_unused,
            total_num_scheduled_tokens: step.total_num_scheduled_tokens,
            new_req_ids,
            resumed_req_ids,
            rescheduled_req_ids,
            preempted_req_ids,
            finished_req_ids,
        };
        match Py::new(py, output) {
            Ok(output) => {
                self.unreported.drain(..reported);
                Ok(output)
            }
            Err(error) => {
                restore_columns(py, step, &columns);
                Err(error)
            }
        }
    }
}

/// The id of each request a step scheduled, taken when it was decided (kept with a step
/// whose delivery failed: its requests may finish before the next `schedule()` delivers it).
type StepTexts = rustc_hash::FxHashMap<Handle, Arc<str>>;

/// A step the core decided whose Python view could not be built: the next `schedule()`
/// delivers it.
struct Undelivered {
    step: Step,
    texts: StepTexts,
}

/// The per-step columns a `PySchedulerOutput` holds as numpy arrays.
const NUM_COLUMNS: usize = 19;

/// A step's columns, in `PySchedulerOutput`'s order.
fn column_slots(step: &mut Step) -> [&mut Vec<i32>; NUM_COLUMNS] {
    [
        &mut step.num_scheduled_tokens,
        &mut step.num_computed_tokens,
        &mut step.num_spec_tokens,
        &mut step.spec_token_ids,
        &mut step.num_output_tokens,
        &mut step.num_block_ids,
        &mut step.block_ids,
        &mut step.num_all_token_ids,
        &mut step.all_token_ids,
        &mut step.lora_ids,
        &mut step.structured_output_rows,
        &mut step.new_block_ids_to_zero,
        &mut step.num_new_token_ids,
        &mut step.new_token_ids,
        &mut step.encoder_input_rows,
        &mut step.encoder_input_ids,
        &mut step.external_encoder_input_rows,
        &mut step.external_encoder_input_ids,
        &mut step.external_computed_tokens,
    ]
}

/// The step's columns as read-only numpy arrays that own its buffers (moved, not copied).
/// On error every column is back in `step` as it was.
fn step_columns(py: Python<'_>, step: &mut Step) -> PyResult<[Py<PyArray1<i32>>; NUM_COLUMNS]> {
    let mut made = Vec::with_capacity(NUM_COLUMNS);
    let mut failed = None;
    for slot in column_slots(step) {
        match frozen_array(py, std::mem::take(slot)) {
            Ok(array) => made.push(array),
            Err((error, values)) => {
                *slot = values;
                failed = Some(error);
                break;
            }
        }
    }
    if let Some(error) = failed {
        restore_columns(py, step, &made);
        return Err(error);
    }
    made.try_into().map_err(|_| internal_error(py, format!("a step has {NUM_COLUMNS} columns")))
}

/// Puts back into `step` the columns `arrays` took (a copy of each: the arrays are dropped
/// with the output that failed).
#[cold]
fn restore_columns(py: Python<'_>, step: &mut Step, arrays: &[Py<PyArray1<i32>>]) {
    for (slot, array) in column_slots(step).into_iter().zip(arrays) {
        *slot =
            array.bind(py).try_readonly().ok().and_then(|a| a.as_slice().ok().map(<[i32]>::to_vec)).unwrap_or_default();
    }
}

/// The request scheduler. Thread-safe: calls from several threads are
/// serialized; the GIL is released while a call works.
#[pyclass(frozen, module = "llmsched", name = "Scheduler")]
pub struct PyScheduler {
    /// Set at build, and by `reconfigure` before the first request.
    config: Mutex<Py<PySchedulerConfig>>,
    uid: u64,
    inner: Mutex<Inner>,
    /// `thread_token()` of the thread inside a call, 0 if none. A call builds
    /// Python objects while it holds the lock, which can run the garbage
    /// collector and so a finalizer on the same thread; were that finalizer to
    /// call the scheduler, it would wait forever on its own thread's lock.
    owner: AtomicUsize,
}

impl PyScheduler {
    /// The scheduler's config now.
    fn current_config(&self) -> Arc<SchedulerConfig> {
        self.config.lock().unwrap_or_else(|e| e.into_inner()).get().inner.clone()
    }

    /// Runs one of the core's `finish_*` calls that fail requests the engine reports
    /// (grammars, encoder mismatches) and returns the ids it finished, retired as finished.
    fn finish_failed<'py>(
        &self,
        py: Python<'py>,
        finish: impl FnOnce(&mut Scheduler) -> Vec<(Handle, Arc<str>)>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.with_inner(py, |inner| {
            let before = inner.core.finished_since_last_step().len();
            let num_unreported = inner.unreported.len();
            let finished = finish(&mut inner.core);
            inner.retire_finished_since(before);
            debug_assert_eq!(inner.unreported.len() - num_unreported, finished.len());
            let ids = inner.unreported[num_unreported..].iter().map(|(_, id)| id.bind(py).clone()).collect();
            new_list(py, ids)
        })
    }

    /// Runs `f` on the locked state; a panic inside becomes `InternalError`
    /// and marks the scheduler broken.
    fn with_inner<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Inner) -> PyResult<R>) -> PyResult<R> {
        let me = thread_token();
        if self.owner.load(Ordering::Acquire) == me {
            return Err(reentrant_call_error(
                py,
                "this thread is already inside a call on this Scheduler (the inner call came from a \
                 finalizer or a callback run during it); refused, nothing changed"
                    .into(),
            ));
        }
        let mut guard = self
            .inner
            .lock_py_attached(py)
            .map_err(|_| internal_error(py, "the scheduler's lock is poisoned".into()))?;
        self.owner.store(me, Ordering::Release);
        let _release = OwnerRelease(&self.owner);
        if let Some(reason) = &guard.broken {
            return Err(internal_error(py, format!("the scheduler is unusable after an internal error: {reason}")));
        }
        match catch_unwind(AssertUnwindSafe(|| f(&mut guard))) {
            Ok(result) => result,
            Err(payload) => {
                let reason = panic_reason(payload.as_ref());
                guard.broken = Some(reason.clone());
                Err(internal_error(py, format!("internal error in llmsched (please report it): {reason}")))
            }
        }
    }
}

/// Refuses a `source` (named `field`) that lacks one of `methods`.
fn has_methods(py: Python<'_>, source: Option<&Bound<'_, PyAny>>, field: &str, methods: &[&str]) -> PyResult<()> {
    let Some(source) = source else {
        return Ok(());
    };
    for method in methods {
        if !source.getattr(*method).is_ok_and(|m| m.is_callable()) {
            return Err(request_error(py, format!("{field}: must have a method {method}, got {}", type_name(source))));
        }
    }
    Ok(())
}

/// A ``request_id`` argument as the str it must be.
fn request_id_arg<'a>(py: Python<'_>, request_id: &'a Bound<'_, PyAny>) -> PyResult<std::borrow::Cow<'a, str>> {
    request_id
        .cast::<PyString>()
        .map_err(|_| request_error(py, format!("request_id: must be a str, got {}", type_name(request_id))))?
        .to_cow()
}

/// The ids of the requests `step` scheduled, as they are now (kept with a step that is
/// not delivered: its requests may finish before the next `schedule()` delivers it).
fn step_texts(core: &Scheduler, step: &Step) -> StepTexts {
    step.req_handles.iter().filter_map(|h| core.request(*h).map(|r| (*h, r.id().clone()))).collect()
}

/// A list (any iterable but a str) of str argument named `field`; None is empty.
fn str_list(py: Python<'_>, value: Option<&Bound<'_, PyAny>>, field: &str) -> PyResult<Vec<String>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    let refuse = || request_error(py, format!("{field}: must be a list of str, got {}", type_name(value)));
    if value.is_instance_of::<PyString>() {
        return Err(refuse());
    }
    value
        .try_iter()
        .map_err(|_| refuse())?
        .map(|item| item.and_then(|i| i.extract::<String>()).map_err(|_| refuse()))
        .collect()
}

/// A Python callable as the core's external KV source (see ``schedule``'s ``external_kv``).
/// The first error it meets is kept for the caller to raise; from then on every request
/// asked waits.
struct PyExternalKv<'a, 'py> {
    callable: &'a Bound<'py, PyAny>,
    /// The connector's `has_pending_block_frees`, if given.
    pending_block_frees: Option<&'a Bound<'py, PyAny>>,
    error: Option<PyErr>,
}

impl ExternalKv for PyExternalKv<'_, '_> {
    fn num_new_matched_tokens(
        &mut self,
        request: &llmsched_core::Request,
        num_local_computed: i64,
    ) -> Option<ExternalMatch> {
        if self.error.is_some() {
            return None;
        }
        let py = self.callable.py();
        let field = || format!("external_kv({:?}, {num_local_computed})", request.id());
        let answer = self.callable.call1((PyRequest::snapshot(request), num_local_computed)).and_then(|answer| {
            // vLLM's pair (tokens or None, whether the load runs across steps), or the tokens
            // alone (a load done before the step runs).
            let (tokens, load_async) = match answer.cast::<PyTuple>() {
                Ok(pair) if pair.len() == 2 => {
                    let load_async =
                        bool_value(py, &pair.get_item(1)?, &format!("{}[1]", field()).as_str(), request_error)?;
                    (pair.get_item(0)?, load_async)
                }
                Ok(_) => {
                    return Err(request_error(
                        py,
                        format!(
                            "{}: must return an int, None or a pair (int or None, bool), got a tuple of {}",
                            field(),
                            answer.len()?
                        ),
                    ))
                }
                Err(_) => (answer, false),
            };
            if tokens.is_none() {
                return Ok(None);
            }
            let tokens = int_value(py, &tokens, &field().as_str(), request_error)?;
            Ok(Some(ExternalMatch { tokens, load_async }))
        });
        answer.unwrap_or_else(|error| {
            self.error = Some(error);
            None
        })
    }

    fn has_pending_block_frees(&mut self) -> bool {
        let Some(callable) = self.pending_block_frees.filter(|_| self.error.is_none()) else {
            return false;
        };
        let py = callable.py();
        let answer =
            callable.call0().and_then(|answer| bool_value(py, &answer, &"pending_block_frees()", request_error));
        answer.unwrap_or_else(|error| {
            self.error = Some(error);
            false
        })
    }
}

/// `encoder_cache_contents`' answer (see there).
type EncoderCacheContents = (Vec<(String, i64, Vec<String>)>, Vec<String>);

/// A Python object as the core's external encoder source (see ``schedule``'s
/// ``external_encoder``). The first error it meets is kept for the caller to raise; from
/// then on every output is encoded and every request asked is passed over.
struct PyExternalEncoder<'a, 'py>(PySource<'a, 'py>);

/// An answer as a bool (an error names the call).
fn bool_answer(py: Python<'_>, answer: &Bound<'_, PyAny>, field: &str) -> PyResult<bool> {
    bool_value(py, answer, &field, request_error)
}

impl ExternalEncoderCache for PyExternalEncoder<'_, '_> {
    fn has_cache_item(&mut self, identifier: &str) -> bool {
        let field = || format!("external_encoder.has_cache_item({identifier:?})");
        self.0
            .ask(
                &field,
                |source| source.call_method1(intern!(source.py(), "has_cache_item"), (identifier,)),
                bool_answer,
            )
            .unwrap_or(false)
    }

    fn ensure_cache_available(&mut self, request: &llmsched_core::Request, num_computed_tokens: i64) -> bool {
        let field = || format!("external_encoder.ensure_cache_available({:?}, {num_computed_tokens})", request.id());
        self.0
            .ask(
                &field,
                |source| {
                    source.call_method1(
                        intern!(source.py(), "ensure_cache_available"),
                        (PyRequest::snapshot(request), num_computed_tokens),
                    )
                },
                bool_answer,
            )
            .unwrap_or(false)
    }
}

/// Flat drafts as the binding received them: a runner's int32 array, or Python ints.
enum Drafts {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
}

impl Drafts {
    /// `Scheduler::update_draft_token_ids_of` with these drafts.
    fn give(&self, core: &mut Scheduler, requests: &[RequestRef<'_>], counts: &[i64]) -> PyResult<()> {
        match self {
            Self::Int32(drafts) => core.update_draft_token_ids_of(requests, drafts, counts),
            Self::Int64(drafts) => core.update_draft_token_ids_of(requests, drafts, counts),
        }
        .map_err(core_err)
    }
}

/// The drafts of `update_draft_token_ids` for `num_ids` requests, flat, and their counts:
/// with `num_draft_tokens`, `draft_token_ids` is flat already (a runner's int32 array is
/// taken as it is); without, it is one row of drafts per request. Each list is read no
/// further than one item past what can be valid.
fn read_drafts(
    py: Python<'_>,
    config: &SchedulerConfig,
    draft_token_ids: &Bound<'_, PyAny>,
    num_draft_tokens: Option<&Bound<'_, PyAny>>,
    num_ids: usize,
) -> PyResult<(Drafts, Vec<i64>)> {
    let rows_limit = ListLimit::one_per_request(num_ids, "rows");
    if let Some(counts) = num_draft_tokens {
        // A list or an array is in memory already, and the core names the request given too
        // many; any other iterable is read no further than `K` drafts per request.
        let sized = draft_token_ids.is_instance_of::<PyList>() || draft_token_ids.is_instance_of::<PyUntypedArray>();
        let limit = if sized { ListLimit::unlimited() } else { config.drafts_limit(num_ids) };
        let drafts = match int32_items(py, draft_token_ids) {
            Some(drafts) => Drafts::Int32(drafts?),
            None => Drafts::Int64(token_list(py, draft_token_ids, &"draft_token_ids", request_error, &limit)?),
        };
        let counts_limit = ListLimit::one_per_request(num_ids, "counts");
        return Ok((drafts, token_list(py, counts, &"num_draft_tokens", request_error, &counts_limit)?));
    }
    let not_iterable = || {
        request_error(
            py,
            format!("draft_token_ids: must be a sequence of token lists, got {}", type_name(draft_token_ids)),
        )
    };
    let per_request = config.drafts_per_request_limit();
    let (mut drafts, mut counts) = (Vec::new(), reserved(num_ids));
    for_each_bounded(draft_token_ids, &rows_limit, &"draft_token_ids", not_iterable, |i, row| {
        let row = token_list(py, &row, &Indexed(&"draft_token_ids", i), request_error, &per_request)?;
        push(&mut counts, row.len() as i64)?;
        drafts.try_reserve(row.len()).map_err(|_| PyMemoryError::new_err("cannot grow the drafts"))?;
        drafts.extend_from_slice(&row);
        Ok(())
    })?;
    Ok((Drafts::Int64(drafts), counts))
}

/// A runner's int32 column, copied: exactly the values a 1-D int32 array holds, in any
/// layout or byte order.
fn runner_int32(py: Python<'_>, value: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<i32>> {
    if let Ok(array) = value.cast::<PyUntypedArray>() {
        if array.ndim() != 1 {
            return Err(mismatch_error(
                py,
                format!("runner_output.{field}: must be 1-D, got shape {:?}", array.shape()),
            ));
        }
    }
    int32_items(py, value).unwrap_or_else(|| {
        let dtype =
            value.getattr("dtype").and_then(|d| d.str()).map(|d| d.to_string()).unwrap_or_else(|_| type_name(value));
        Err(mismatch_error(py, format!("runner_output.{field}: must be a 1-D numpy int32 array, got {dtype}")))
    })
}

/// vLLM's runner shape, one list of token ids per request, as flat tokens and counts (read
/// while the GIL is held, like the arrays).
fn token_rows(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<(Vec<i32>, Vec<i32>)> {
    let rows = value.cast::<PyList>().map_err(|_| {
        mismatch_error(
            py,
            format!(
                "runner_output.sampled_token_ids: with num_sampled=None, must be a list of token-id lists, got {}",
                type_name(value)
            ),
        )
    })?;
    let mut tokens = Vec::with_capacity(rows.len());
    let mut counts = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let row = row.cast_into::<PyList>().map_err(|e| {
            mismatch_error(
                py,
                format!(
                    "runner_output.sampled_token_ids[{i}]: must be a list of token ids, got {}",
                    type_name(e.into_inner().as_any())
                ),
            )
        })?;
        let count = i32::try_from(row.len())
            .map_err(|_| mismatch_error(py, format!("runner_output.sampled_token_ids[{i}]: {} tokens", row.len())))?;
        for (j, token) in row.iter().enumerate() {
            let token = token.extract::<i32>().map_err(|_| {
                mismatch_error(
                    py,
                    format!(
                        "runner_output.sampled_token_ids[{i}][{j}]: must be an int32 token id, got {}",
                        type_name(&token)
                    ),
                )
            })?;
            tokens.push(token);
        }
        counts.push(count);
    }
    Ok((tokens, counts))
}

/// For each step entry, the runner row holding it; `None` if the runner kept the step's order.
fn runner_rows(py: Python<'_>, step_ids: &StepIds, runner_ids: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u32>>> {
    // Fast path without an iterator or a reference count: a list of the very same id
    // objects, in order.
    if let Ok(list) = runner_ids.cast::<PyList>() {
        if list.len() == step_ids.len()
            && step_ids.addresses().enumerate().all(|(i, id)| {
                // SAFETY: the GIL is held and `list` is alive; `i` is in bounds (a borrowed
                // item, only compared by address).
                unsafe { pyo3::ffi::PyList_GetItem(list.as_ptr(), i as pyo3::ffi::Py_ssize_t) == id }
            })
        {
            return Ok(None);
        }
    }
    let iter = runner_ids.try_iter().map_err(|_| {
        mismatch_error(py, format!("runner_output.req_ids: must be a sequence of str, got {}", type_name(runner_ids)))
    })?;
    // Read no further than one id past the step's (an endless iterable is refused).
    let runner_ids: Vec<Bound<'_, PyAny>> = iter.take(step_ids.len() + 1).collect::<PyResult<_>>()?;
    if runner_ids.len() > step_ids.len() {
        return Err(mismatch_error(
            py,
            format!(
                "runner_output.req_ids has over {} requests but the step scheduled {}",
                step_ids.len(),
                step_ids.len()
            ),
        ));
    }
    if runner_ids.len() != step_ids.len() {
        return Err(mismatch_error(
            py,
            format!(
                "runner_output.req_ids has {} requests but the step scheduled {}",
                runner_ids.len(),
                step_ids.len()
            ),
        ));
    }
    // Fast path: the very same id objects, in order.
    if runner_ids.iter().zip(step_ids.addresses()).all(|(a, b)| a.as_ptr() == b) {
        return Ok(None);
    }
    // An engine's runner keeps its own batch order, with the very id objects the step
    // handed out: match them by object, and by text only if some id is another object.
    // (n distinct step objects found among n runner rows: the rows are a permutation.)
    let mut row_of_object = rustc_hash::FxHashMap::with_capacity_and_hasher(runner_ids.len(), Default::default());
    for (row, id) in runner_ids.iter().enumerate() {
        if row_of_object.insert(id.as_ptr() as usize, row as u32).is_some() {
            break; // the same object twice: the text path below names it
        }
    }
    let rows: Vec<u32> = step_ids.addresses().map_while(|id| row_of_object.get(&(id as usize)).copied()).collect();
    if rows.len() == step_ids.len() && row_of_object.len() == runner_ids.len() {
        return Ok(Some(rows));
    }
    let mut row_of_id = std::collections::HashMap::with_capacity(runner_ids.len());
    for (row, id) in runner_ids.iter().enumerate() {
        let id = id
            .cast::<PyString>()
            .map_err(|_| {
                mismatch_error(py, format!("runner_output.req_ids[{row}]: must be a str, got {}", type_name(id)))
            })?
            .to_cow()?
            .into_owned();
        if row_of_id.insert(id.clone(), row as u32).is_some() {
            return Err(mismatch_error(py, format!("runner_output.req_ids: {id:?} appears twice")));
        }
    }
    let mut rows = Vec::with_capacity(step_ids.len());
    for i in 0..step_ids.len() {
        let id = step_ids.get(py, i).to_cow()?.into_owned();
        match row_of_id.get(&id) {
            Some(&row) => rows.push(row),
            None => {
                return Err(mismatch_error(
                    py,
                    format!("runner_output.req_ids: misses {id:?}, which the step scheduled"),
                ))
            }
        }
    }
    Ok(Some(rows))
}

/// A request's ``cache_salt`` argument: a str, or None.
fn cache_salt_arg(py: Python<'_>, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match value {
        Some(v) if !v.is_none() => Ok(Some(
            v.cast::<PyString>()
                .map_err(|_| request_error(py, format!("cache_salt: must be a str or None, got {}", type_name(v))))?
                .to_cow()?
                .into_owned(),
        )),
        _ => Ok(None),
    }
}

/// A request's flag argument (``field``): a bool, False when absent.
fn flag_arg(py: Python<'_>, value: Option<&Bound<'_, PyAny>>, field: &'static str) -> PyResult<bool> {
    value.map_or(Ok(false), |v| bool_value(py, v, &field, request_error))
}

/// A request's optional int argument (``field``): an int, or None (or absent).
fn optional_int_arg(py: Python<'_>, value: Option<&Bound<'_, PyAny>>, field: &'static str) -> PyResult<Option<i64>> {
    match value {
        Some(v) if !v.is_none() => Ok(Some(int_value(py, v, &field, request_error)?)),
        _ => Ok(None),
    }
}

/// A request's ``mm_inputs`` argument, within the config's limits (none for None).
fn mm_inputs_arg(
    py: Python<'_>,
    config: &SchedulerConfig,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<llmsched_core::MmInputSpec>> {
    match value {
        Some(v) if !v.is_none() => {
            let limits = (&config.mm_input_limit("inputs"), &config.mm_input_limit("flags"));
            mm_input_list(py, v, limits, request_error)
        }
        _ => Ok(Vec::new()),
    }
}

/// A request's ``prompt_embeds_keys`` argument: bytes, one per block, within the config's
/// limit (none for None).
fn prompt_embeds_keys_arg(
    py: Python<'_>,
    config: &SchedulerConfig,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Vec<u8>>> {
    let Some(value) = value.filter(|v| !v.is_none()) else { return Ok(Vec::new()) };
    let field = "prompt_embeds_keys";
    let not_iterable = || request_error(py, format!("{field}: must be an iterable of bytes, got {}", type_name(value)));
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(not_iterable());
    }
    let mut keys = Vec::new();
    for_each_bounded(value, &config.prompt_embeds_keys_limit(), &field, not_iterable, |i, item| {
        let key = item
            .cast::<PyBytes>()
            .map_err(|_| request_error(py, format!("{field}[{i}]: must be bytes, got {}", type_name(&item))))?;
        keys.push(key.as_bytes().to_vec());
        Ok(())
    })?;
    Ok(keys)
}

/// A block id argument: a non-negative int.
fn block_id_arg(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<u32> {
    value.extract::<u32>().map_err(|_| {
        request_error(
            py,
            format!(
                "block_id: must be a block id (an int >= 0), got {}",
                value.repr().map_or_else(|_| type_name(value), |r| r.to_string())
            ),
        )
    })
}

#[pymethods]
impl PyScheduler {
    #[new]
    fn new(py: Python<'_>, config: Bound<'_, PyAny>) -> PyResult<Self> {
        let config = config.cast_into::<PySchedulerConfig>().map_err(|e| {
            crate::errors::config_error(
                py,
                format!("config: must be a SchedulerConfig, got {}", type_name(e.into_inner().as_any())),
            )
        })?;
        let core = Scheduler::new(config.get().inner.clone()).map_err(core_err)?;
        Ok(Self {
            config: Mutex::new(config.unbind()),
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            inner: Mutex::new(Inner {
                core,
                py_ids: Vec::new(),
                handle_by_address: Default::default(),
                unreported: Vec::new(),
                undelivered: None,
                batch: IdBatch::default(),
                broken: None,
            }),
            owner: AtomicUsize::new(0),
        })
    }

    /// The scheduler's configuration (the one it was built with, or set by ``reconfigure``).
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PySchedulerConfig> {
        self.config.lock().unwrap_or_else(|e| e.into_inner()).clone_ref(py)
    }

    /// Take ``config`` in place of the one the scheduler was built with, as if built with
    /// it. Only before the scheduler's first request and ``schedule()`` call: after,
    /// ``ConfigError``, changing nothing (a config holds for every step of a request). The
    /// decode stagger and pause state set since building are kept.
    fn reconfigure(&self, py: Python<'_>, config: Bound<'_, PyAny>) -> PyResult<()> {
        let config = config.cast_into::<PySchedulerConfig>().map_err(|e| {
            crate::errors::config_error(
                py,
                format!("config: must be a SchedulerConfig, got {}", type_name(e.into_inner().as_any())),
            )
        })?;
        let inner_config = config.get().inner.clone();
        self.with_inner(py, |inner| {
            py.detach(|| inner.core.reconfigure(inner_config)).map_err(core_err)?;
            *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config.unbind();
            Ok(())
        })
    }

    /// Queue a request. Copies the prompt into the scheduler.
    ///
    /// ``prompt_token_ids`` and ``stop_token_ids`` are iterables of ints or 1-D numpy
    /// integer arrays, read exactly as numpy reads them (any layout, byte order or width).
    /// An iterable is read no further than one token past the longest valid list
    /// (the config's ``max_request_len`` minus the sampled token for a prompt, 2**20 stop
    /// token ids).
    ///
    /// Raises ``InvalidRequestError`` (``DuplicateRequestError`` for an id still live)
    /// naming the field and the value, and changes nothing, for a request that could
    /// never run: an empty prompt, one longer than ``max_request_len`` (``max_model_len``,
    /// or what a small KV pool holds) minus the sampled token, or a token id outside
    /// int32. A request stops, length-capped, at ``max_request_len`` tokens. ``lora_id``
    /// names the LoRA adapter the request runs under (a positive int; the config's
    /// ``max_loras`` must be at least 1). ``skip_reading_prefix_cache`` admits it without
    /// reading the prefix cache (vLLM sets it for prompt logprobs: every prompt position is
    /// computed); its blocks are still cached for other requests. ``structured_output``: its
    /// output follows a grammar the engine compiles; it waits
    /// (``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``), passed over without blocking others,
    /// until ``resolve_grammar`` reports the grammar compiled. ``report_reused_blocks``:
    /// with ``enable_kv_cache_events``, each of its prefix lookups with a hit is recorded as
    /// a ``"reused"`` event (vLLM's ``kv_cache_report_mode="full"``). ``mm_inputs``: its
    /// multimodal inputs in prompt order, each ``(identifier, offset, length)`` or
    /// ``(identifier, offset, length, is_embed)``: the encoder output's identifier (inputs
    /// with the same one share it), where its placeholders start in the prompt, how many
    /// there are, and which of them carry an embedding (one bool each; all when absent);
    /// only with an encoder budget (``max_num_encoder_input_tokens``), and each input
    /// within it. ``prompt_embeds_keys``: for a prompt given as embeddings (vLLM's
    /// ``prompt_embeds``; its token ids are placeholders), one ``bytes`` key per block the
    /// prompt reaches (a digest of that block's embeddings, 1 to 64 bytes): each enters its
    /// block's hash, so requests share cached blocks only as far as their embeddings match.
    ///
    /// ``resumable`` makes it a streaming-input session (vLLM's resumable requests): a stop
    /// (its ``RequestOutput`` carries the stop's status, the input's finish reason) ends the
    /// session's current input, not the request, which keeps the KV of its tokens but the
    /// last sampled one and waits for its next input (``WAITING_FOR_STREAMING_REQ``, holding
    /// one of ``max_num_seqs``' slots). The next input is an ``add_request`` under the same
    /// id with ``resumable=True``: its prompt extends the session's tokens and its
    /// ``max_tokens``, ``eos_token_id``, ``stop_token_ids`` and ``arrival_time`` replace the
    /// session's (the rest is the session's); added while the session still runs, it is
    /// taken up at the stop. One added without ``resumable`` ends the session: at its stop,
    /// or at once (aborted) if it waits for input. Returns what an input did: ``"queued"``,
    /// ``"taken_up"`` or ``"finished"`` (then ``take_finished_requests`` has its record);
    /// None for a new request. An input that does not fit (the session's tokens past the
    /// prompt limit, or KV past the pool) raises ``InvalidRequestError`` and changes
    /// nothing; one that does not fit when taken up at a stop ends the session instead.
    ///
    /// For a diffusion model (``num_sampled_tokens_per_step=0`` with a canvas of
    /// ``num_speculative_tokens``), ``diffusion_canvas_length`` narrows the request's canvas
    /// (the drafts each step gives it: drafts handed in beyond it are cut), and
    /// ``diffusion_read_steps`` makes it a read of that many denoising steps, passed over
    /// under async scheduling while every one of them is in flight.
    #[pyo3(signature = (request_id, prompt_token_ids, *, max_tokens, min_tokens=None, eos_token_id=None,
        stop_token_ids=None, arrival_time=None, num_computed_tokens=None, priority=None, cache_salt=None,
        lora_id=None, skip_reading_prefix_cache=None, structured_output=None, report_reused_blocks=None,
        mm_inputs=None, prompt_embeds_keys=None, resumable=None, diffusion_canvas_length=None,
        diffusion_read_steps=None),
        text_signature = "(self, request_id, prompt_token_ids, *, max_tokens, min_tokens=0, eos_token_id=None, \
        stop_token_ids=(), arrival_time=None, num_computed_tokens=0, priority=0, cache_salt=None, \
        lora_id=None, skip_reading_prefix_cache=False, structured_output=False, report_reused_blocks=False, \
        mm_inputs=(), prompt_embeds_keys=(), resumable=False, diffusion_canvas_length=None, \
        diffusion_read_steps=None)")]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        eos_token_id: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        arrival_time: Option<&Bound<'_, PyAny>>,
        num_computed_tokens: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        lora_id: Option<&Bound<'_, PyAny>>,
        skip_reading_prefix_cache: Option<&Bound<'_, PyAny>>,
        structured_output: Option<&Bound<'_, PyAny>>,
        report_reused_blocks: Option<&Bound<'_, PyAny>>,
        mm_inputs: Option<&Bound<'_, PyAny>>,
        prompt_embeds_keys: Option<&Bound<'_, PyAny>>,
        resumable: Option<&Bound<'_, PyAny>>,
        diffusion_canvas_length: Option<&Bound<'_, PyAny>>,
        diffusion_read_steps: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<&'static str>> {
        let id = request_id.cast::<PyString>().map_err(|_| {
            request_error(
                py,
                format!(
                    "request_id={}: must be a str, got {}",
                    request_id.repr().map(|r| r.to_string()).unwrap_or_default(),
                    type_name(request_id)
                ),
            )
        })?;
        let config = self.current_config();
        let new = NewRequest {
            request_id: id.to_cow()?.into_owned(),
            prompt_token_ids: token_list(
                py,
                prompt_token_ids,
                &"prompt_token_ids",
                request_error,
                &config.prompt_limit(),
            )?,
            max_tokens: int_value(py, max_tokens, &"max_tokens", request_error)?,
            min_tokens: optional_int_arg(py, min_tokens, "min_tokens")?.unwrap_or(0),
            eos_token_id: optional_int_arg(py, eos_token_id, "eos_token_id")?,
            stop_token_ids: match stop_token_ids {
                Some(v) if !v.is_none() => {
                    token_list(py, v, &"stop_token_ids", request_error, &ListLimit::stop_token_ids())?
                }
                _ => Vec::new(),
            },
            arrival_time: match arrival_time {
                Some(v) if !v.is_none() => Some(float_value(py, v, &"arrival_time", request_error)?),
                _ => None,
            },
            num_computed_tokens: optional_int_arg(py, num_computed_tokens, "num_computed_tokens")?.unwrap_or(0),
            priority: optional_int_arg(py, priority, "priority")?.unwrap_or(0),
            cache_salt: cache_salt_arg(py, cache_salt)?,
            lora_id: optional_int_arg(py, lora_id, "lora_id")?,
            skip_reading_prefix_cache: flag_arg(py, skip_reading_prefix_cache, "skip_reading_prefix_cache")?,
            structured_output: flag_arg(py, structured_output, "structured_output")?,
            report_reused_blocks: flag_arg(py, report_reused_blocks, "report_reused_blocks")?,
            mm_inputs: mm_inputs_arg(py, &config, mm_inputs)?,
            prompt_embeds_keys: prompt_embeds_keys_arg(py, &config, prompt_embeds_keys)?,
            resumable: flag_arg(py, resumable, "resumable")?,
            diffusion_canvas_length: optional_int_arg(py, diffusion_canvas_length, "diffusion_canvas_length")?,
            diffusion_read_steps: optional_int_arg(py, diffusion_read_steps, "diffusion_read_steps")?,
        };
        // Keep an exact str: a subclass instance could carry state of its own.
        let py_id: Py<PyString> = if id.is_exact_instance_of::<PyString>() {
            id.clone().unbind()
        } else {
            new_str(py, &new.request_id)?.unbind()
        };
        self.with_inner(py, |inner| {
            let finished_before = inner.core.finished_since_last_step().len();
            let (handle, input) = inner.core.add_request_or_input(new).map_err(core_err)?;
            if let Some(input) = input {
                // An input of a live session: the session keeps its id object.
                inner.retire_finished_since(finished_before);
                return Ok(Some(match input {
                    SessionInputAdded::Queued => "queued",
                    SessionInputAdded::TakenUp => "taken_up",
                    SessionInputAdded::Finished => "finished",
                }));
            }
            let index = handle.index as usize;
            if inner.py_ids.len() <= index {
                inner.py_ids.resize_with(index + 1, || None);
            }
            inner.handle_by_address.insert(py_id.as_ptr() as usize, handle);
            inner.py_ids[index] = Some((handle.generation, py_id));
            Ok(None)
        })
    }

    /// Decide the next step: which requests run and how many tokens each.
    ///
    /// Runs the running loop (decodes and prefill chunks of running requests, preempting
    /// the lowest-priority running request when KV blocks run out), then, if nothing was
    /// preempted, admits waiting requests in order. Every scheduled request keeps
    /// ``C + n + s <= max_model_len``. Returns the step as a ``SchedulerOutput``.
    ///
    /// Should building that output fail (Python out of memory), the step stays decided and
    /// in flight, and the next ``schedule()`` returns it before deciding another.
    ///
    /// ``throttle_prefills`` (vLLM's, for data-parallel prefill balancing): while a request
    /// decodes, the step carries no prefill, unless the waiting requests outgrew the last
    /// step that admitted (``prefill_schedule_interval`` holds prefill back the same way).
    ///
    /// ``external_kv`` (with the config's ``kv_connector``): a KV connector's answer for a
    /// waiting request with no computed tokens, asked where vLLM's waiting loop asks it:
    /// called as ``external_kv(request, num_local_computed_tokens)`` with a ``Request``
    /// snapshot and the tokens its prefix-cache hit covers, it returns how many tokens past
    /// those the connector loads, or None if it cannot tell yet (the request waits this
    /// step); or vLLM's pair ``(tokens or None, load_async)``. A load with ``load_async``
    /// runs across steps: the request takes blocks for the loaded tokens and waits in
    /// ``WAITING_FOR_REMOTE_KVS`` (``SchedulerOutput.kv_loads``) until
    /// ``finish_kv_transfers`` reports it received. The GIL is held through such a step.
    /// Should it raise or return something else, the request waits, the step is decided
    /// without it, and the error is raised; the next ``schedule()`` returns that step.
    ///
    /// ``pending_block_frees`` (with ``external_kv``): the connector's
    /// ``has_pending_block_frees``, called with no argument where the running loop would
    /// preempt a request for KV blocks: while it returns True (transfers in flight will give
    /// blocks back), the loop preempts none and schedules no further running request, as
    /// vLLM's. Should it raise or return something else, the step is decided as if it
    /// returned False, and the error is raised as above.
    ///
    /// ``external_encoder`` (with the config's ``ec_connector``): an encoder-cache
    /// connector, asked only about requests with multimodal inputs, where vLLM's loops ask
    /// it: ``external_encoder.ensure_cache_available(request, num_computed_tokens)`` before
    /// a request's tokens are counted (with a ``Request`` snapshot; False: its encoder
    /// outputs are in transit, and the request is passed over in this step), and
    /// ``external_encoder.has_cache_item(identifier)`` for an input a chunk needs that is
    /// not in the encoder cache, once the cache has room for it and the step's encoder
    /// budget could encode it (True: the connector loads its output,
    /// ``SchedulerOutput.external_encoder_input_rows``, and the budget is not charged).
    /// Each returns a bool. The GIL is held through such a step. A source without those
    /// methods is refused before anything changes. Should either raise or return something
    /// else, from then on in the step every input is encoded and every request asked is
    /// passed over, and the error is raised as above.
    ///
    /// ``aux_outputs``: an auxiliary-output connector (vLLM's
    /// ``AuxOutputSchedulerConnector``, routed experts), asked where vLLM's loops ask it:
    /// ``aux_outputs.max_cache_hit(request, cache)`` for a waiting request with no computed
    /// tokens, before its prefix-cache lookup (the longest hit it may take, in tokens;
    /// clamped to ``[0, N - 1]``); ``aux_outputs.cap_external_hit(request, num_local,
    /// num_external, cache)`` after a KV connector's answer (the external tokens kept,
    /// clamped to ``[0, num_external]``); ``aux_outputs.request_finished(request, cache)``
    /// when the running loop preempts a request, before its blocks are freed. ``request`` is a
    /// ``Request`` snapshot, ``cache`` a ``CachedBlocks``: the prefix cache at that point of
    /// the step, readable only during the call. The GIL is held through such a step. A
    /// source without those methods is refused before anything changes. Should one raise
    /// or return something else, from then on in the step no hit and no external token is
    /// kept and no preemption is told, and the error is raised as above.
    #[pyo3(
        signature = (*, throttle_prefills=None, external_kv=None, pending_block_frees=None, external_encoder=None,
                     aux_outputs=None),
        text_signature = "(self, *, throttle_prefills=False, external_kv=None, pending_block_frees=None, \
                          external_encoder=None, aux_outputs=None)"
    )]
    fn schedule(
        &self,
        py: Python<'_>,
        throttle_prefills: Option<&Bound<'_, PyAny>>,
        external_kv: Option<&Bound<'_, PyAny>>,
        pending_block_frees: Option<&Bound<'_, PyAny>>,
        external_encoder: Option<&Bound<'_, PyAny>>,
        aux_outputs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PySchedulerOutput>> {
        let throttle = match throttle_prefills {
            Some(v) => bool_value(py, v, &"throttle_prefills", request_error)?,
            None => false,
        };
        let external_kv = external_kv.filter(|f| !f.is_none());
        if let Some(f) = external_kv {
            if !f.is_callable() {
                return Err(request_error(py, format!("external_kv: must be callable, got {}", type_name(f))));
            }
        }
        let pending_block_frees = pending_block_frees.filter(|f| !f.is_none());
        if let Some(f) = pending_block_frees {
            if !f.is_callable() {
                return Err(request_error(py, format!("pending_block_frees: must be callable, got {}", type_name(f))));
            }
            if external_kv.is_none() {
                return Err(request_error(
                    py,
                    "pending_block_frees: a KV connector's, given with its external_kv".into(),
                ));
            }
        }
        let external_encoder = external_encoder.filter(|source| !source.is_none());
        has_methods(py, external_encoder, "external_encoder", &["has_cache_item", "ensure_cache_available"])?;
        let aux_outputs = aux_outputs.filter(|source| !source.is_none());
        has_methods(py, aux_outputs, "aux_outputs", &["max_cache_hit", "cap_external_hit", "request_finished"])?;
        self.with_inner(py, |inner| {
            let mut source_error = None;
            let (mut step, texts) = match inner.undelivered.take() {
                Some(Undelivered { step, texts }) => (step, Some(texts)),
                None => {
                    let core = &mut inner.core;
                    if external_kv.is_none() && external_encoder.is_none() && aux_outputs.is_none() {
                        (py.detach(|| core.schedule_throttled(throttle)), None)
                    } else {
                        // A connector is Python: the GIL stays held for this step.
                        let mut kv =
                            external_kv.map(|callable| PyExternalKv { callable, pending_block_frees, error: None });
                        let mut encoder = external_encoder.map(|source| PyExternalEncoder(PySource::new(source)));
                        let mut aux = aux_outputs.map(|source| PyAuxOutputs(PySource::new(source)));
                        let connectors = Connectors {
                            kv: kv.as_mut().map(|kv| kv as &mut dyn ExternalKv),
                            encoder: encoder.as_mut().map(|encoder| encoder as &mut dyn ExternalEncoderCache),
                            aux: aux.as_mut().map(|aux| aux as &mut dyn AuxOutputs),
                        };
                        let step = core.schedule_with(throttle, connectors);
                        source_error = kv
                            .and_then(|kv| kv.error)
                            .or(encoder.and_then(|encoder| encoder.0.error))
                            .or(aux.and_then(|aux| aux.0.error));
                        (step, None)
                    }
                }
            };
            if let Some(error) = source_error {
                let texts = step_texts(&inner.core, &step);
                inner.undelivered = Some(Undelivered { step, texts });
                return Err(error);
            }
            inner.build_output(py, self.uid, &mut step, texts.as_ref()).inspect_err(|_| {
                let texts = texts.unwrap_or_else(|| step_texts(&inner.core, &step));
                inner.undelivered = Some(Undelivered { step, texts });
            })
        })
    }

    /// Apply a runner's output for ``scheduler_output``.
    ///
    /// ``runner_output`` is a ``llmsched.ModelRunnerOutput`` (or any object with
    /// ``req_ids``, ``sampled_token_ids`` and ``num_sampled``; with ``num_sampled=None``,
    /// ``sampled_token_ids`` may be vLLM's shape, a list of token-id lists, one per entry of
    /// ``req_ids``, flattened here without a Python object per token). Outputs must be applied
    /// once each, in the order the steps were scheduled; the output of a step that
    /// scheduled nothing is a no-op. ``sampled_token_ids`` and ``num_sampled`` are 1-D numpy
    /// int32 arrays, read exactly as numpy reads them (any layout or byte order). Copies the
    /// runner's arrays before it releases the GIL, so a thread writing into them during the
    /// call cannot change what is applied.
    /// Returns a sequence of ``RequestOutput``, one per request that produced tokens or
    /// finished.
    ///
    /// ``aux_outputs`` (see ``schedule``): told of each request the output finishes, where
    /// vLLM's update tells it, as ``aux_outputs.request_finished(request, cache)`` (before
    /// its blocks are freed; the blocks of requests later in the step are not cached yet).
    /// The GIL is held through such an update. Should it raise, the output is applied all
    /// the same (no further call is made), and the error is raised: that output's
    /// ``RequestOutput`` sequence is lost (vLLM's engine fails there too).
    #[pyo3(signature = (scheduler_output, runner_output, *, aux_outputs=None))]
    fn update_from_output<'py>(
        &self,
        py: Python<'py>,
        scheduler_output: &Bound<'py, PyAny>,
        runner_output: &Bound<'py, PyAny>,
        aux_outputs: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Py<PyRequestOutputs>> {
        let aux_outputs = aux_outputs.filter(|source| !source.is_none());
        has_methods(py, aux_outputs, "aux_outputs", &["request_finished"])?;
        let so = scheduler_output.cast::<PySchedulerOutput>().map_err(|_| {
            mismatch_error(
                py,
                format!("scheduler_output: must be a SchedulerOutput, got {}", type_name(scheduler_output)),
            )
        })?;
        let so = so.get();
        if so.scheduler_uid != self.uid {
            return Err(mismatch_error(
                py,
                format!("scheduler_output: step {} was scheduled by another Scheduler", so.step_id),
            ));
        }
        // Interned names: a `&str` would be made into a new string and hashed every call.
        let attr = |name: &Bound<'py, PyString>| {
            runner_output.getattr(name).map_err(|_| {
                mismatch_error(
                    py,
                    format!(
                        "runner_output: has no attribute {:?} (expected a ModelRunnerOutput, got {})",
                        name.to_string(),
                        type_name(runner_output)
                    ),
                )
            })
        };
        let rows = runner_rows(py, &so.entry_ids, &attr(intern!(py, "req_ids"))?)?;
        let sampled_obj = attr(intern!(py, "sampled_token_ids"))?;
        let counts_obj = attr(intern!(py, "num_sampled"))?;
        // Copied while the GIL is held: another Python thread may write into the runner's
        // arrays once the GIL is released, and the core must see one consistent snapshot
        // (a step's int32 columns copy in nanoseconds).
        let (sampled, counts) = if counts_obj.is_none() {
            token_rows(py, &sampled_obj)?
        } else {
            (runner_int32(py, &sampled_obj, "sampled_token_ids")?, runner_int32(py, &counts_obj, "num_sampled")?)
        };
        self.with_inner(py, |inner| {
            // The result first: once the core has applied the output, nothing may fail (the
            // tokens it delivered would be lost).
            let result = Py::new(
                py,
                PyRequestOutputs { step_ids: so.entry_ids.clone(), rows: OnceLock::new(), tokens: sampled },
            )?;
            let sampled = &result.get().tokens;
            let out = RunnerOutput { sampled_token_ids: sampled, num_sampled: &counts, row_of_entry: rows.as_deref() };
            let core = &mut inner.core;
            let mut outputs = Vec::with_capacity(counts.len());
            // The requests this output finishes join the end of the core's list.
            let finished_before = core.finished_since_last_step().len();
            // The events go straight into the output's rows; their tokens stay where the
            // runner's copy holds them.
            let on_event = |e: llmsched_core::RequestEvent| {
                outputs.push(OutputRow {
                    entry: e.entry,
                    start: e.token_offset as u32,
                    len: e.num_tokens as u32,
                    status: e.status,
                    stop_reason: e.stop_reason,
                    num_cached_blocks: e.num_cached_blocks as i32,
                });
            };
            let mut aux_error = None;
            match aux_outputs {
                None => py.detach(|| core.update_from_output_with(so.step_id, &out, on_event, None)),
                Some(source) => {
                    // A connector is Python: the GIL stays held for this update.
                    let mut aux = PyAuxOutputs(PySource::new(source));
                    let applied = core.update_from_output_with(so.step_id, &out, on_event, Some(&mut aux));
                    aux_error = aux.0.error;
                    applied
                }
            }
            .map_err(core_err)?;
            inner.retire_finished_since(finished_before);
            if let Some(error) = aux_error {
                return Err(error);
            }
            // Set once, here, on an object nothing else has seen yet.
            let _ = result.get().rows.set(outputs);
            Ok(result)
        })
    }

    /// Give running requests the drafts to verify in the next step (sync scheduling).
    ///
    /// ``draft_token_ids[i]`` (at most ``num_speculative_tokens`` ids; -1 is a drafter's
    /// padding) replaces the drafts of ``req_ids[i]``. Flat, as a runner holds them: with
    /// ``num_draft_tokens`` given, ``draft_token_ids`` is one int array (or sequence) and
    /// ``num_draft_tokens[i]`` of its ids, in order, belong to ``req_ids[i]``; the arrays
    /// are copied, under the GIL, before the call returns. Ids that are not live are
    /// ignored; drafts of a request that is not running or still in prefill are dropped.
    /// Drafts for a running request whose step is still in flight are refused
    /// (``InvalidRequestError``, nothing changed): hand them in after ``update_from_output``
    /// has applied that step, whose token they follow. Iterables are read no further than
    /// what can be valid: as many ids as live requests plus ``max_num_seqs`` (requests that
    /// finished since their step), one row or count per id, ``num_speculative_tokens``
    /// drafts per id.
    #[pyo3(signature = (req_ids, draft_token_ids, num_draft_tokens=None))]
    fn update_draft_token_ids(
        &self,
        py: Python<'_>,
        req_ids: &Bound<'_, PyAny>,
        draft_token_ids: &Bound<'_, PyAny>,
        num_draft_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let config = self.current_config();
        // Read under the lock: how many requests can be named depends on the live ones.
        self.with_inner(py, |inner| {
            let rows_limit = inner.core.draft_requests_limit();
            // A list is read in place (the usual case: the step's own id objects); any other
            // iterable is collected first.
            let id_list = req_ids.cast::<PyList>().ok();
            let mut ids: Vec<Bound<'_, PyAny>> = Vec::new();
            match id_list {
                Some(list) if !rows_limit.allows(list.len()) => {
                    return Err(core_err(rows_limit.too_long("req_ids", list.len())));
                }
                Some(_) => {}
                None => {
                    let not_iterable =
                        || request_error(py, format!("req_ids: must be a sequence of str, got {}", type_name(req_ids)));
                    for_each_bounded(req_ids, &rows_limit, &"req_ids", not_iterable, |_, id| push(&mut ids, id))?;
                }
            }
            let num_ids = id_list.map_or(ids.len(), |list| list.len());
            let (drafts, counts) = read_drafts(py, &config, draft_token_ids, num_draft_tokens, num_ids)?;
            // The ids the step handed out are known by address; any other str by its text.
            let by_address = id_list.and_then(|list| {
                (0..list.len())
                    .map(|i| {
                        // SAFETY: the GIL is held and `list` is alive; `i` is in bounds (a
                        // borrowed item, only looked up by address).
                        let item = unsafe { pyo3::ffi::PyList_GetItem(list.as_ptr(), i as pyo3::ffi::Py_ssize_t) };
                        inner.handle_by_address.get(&(item as usize)).map(|&h| RequestRef::Handle(h))
                    })
                    .collect::<Option<Vec<_>>>()
            });
            if let Some(requests) = by_address {
                return drafts.give(&mut inner.core, &requests, &counts);
            }
            let listed: Vec<Bound<'_, PyAny>>;
            let ids = match id_list {
                Some(list) => {
                    listed = list.iter().collect();
                    &listed
                }
                None => &ids,
            };
            let requests: Vec<RequestRef<'_>> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| match inner.handle_by_address.get(&(id.as_ptr() as usize)) {
                    Some(&handle) => Ok(RequestRef::Handle(handle)),
                    None => id
                        .cast::<PyString>()
                        .map_err(|_| request_error(py, format!("req_ids[{i}]: must be a str, got {}", type_name(id))))?
                        .to_str()
                        .map(RequestRef::Id),
                })
                .collect::<PyResult<_>>()?;
            drafts.give(&mut inner.core, &requests, &counts)
        })
    }

    /// Finish live requests with a finished ``status``; returns the ids
    /// finished (ids not live are ignored, as in vLLM). None means all.
    ///
    /// ``request_ids`` may be any iterable; it is read one id at a time, keeping only the
    /// live ones, and at most the live requests plus 2**20 ids are read (more is an
    /// ``InvalidRequestError``, and nothing is finished).
    fn finish_requests<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let value = int_value(py, status, &"status", request_error)?;
        let status = RequestStatus::from_value(value)
            .filter(|s| s.is_finished())
            .ok_or_else(|| request_error(py, format!("status={value}: must be a finished RequestStatus (7 to 12)")))?;
        self.with_inner(py, |inner| {
            let requests: Vec<RequestRef<'_>> = if request_ids.is_none() {
                inner.core.live_handles().into_iter().map(RequestRef::Handle).collect()
            } else if let Ok(one) = request_ids.cast::<PyString>() {
                inner
                    .live_handle(py, one.as_any(), || "request_ids".into())?
                    .map(RequestRef::Handle)
                    .into_iter()
                    .collect()
            } else {
                let limit = inner.core.finish_ids_limit();
                let not_iterable = || {
                    request_error(
                        py,
                        format!(
                            "request_ids: must be a str, an iterable of str, or None, got {}",
                            type_name(request_ids)
                        ),
                    )
                };
                // Only the live requests named are kept: memory bounded by the live requests,
                // however many ids the iterable yields.
                let mut seen = rustc_hash::FxHashSet::default();
                let mut live = Vec::new();
                for_each_bounded(request_ids, &limit, &"request_ids", not_iterable, |i, id| {
                    match inner.live_handle(py, &id, || format!("request_ids[{i}]"))? {
                        Some(handle) if seen.insert(handle) => push(&mut live, RequestRef::Handle(handle)),
                        _ => Ok(()),
                    }
                })?;
                live
            };
            // The live requests named are the ones finished, in this order: their ids are
            // listed before the core finishes them, so that nothing can fail after.
            let ids = requests
                .iter()
                .map(|request| match *request {
                    RequestRef::Handle(handle) => inner.step_py_id(py, handle, None),
                    RequestRef::Id(id) => new_str(py, id),
                })
                .collect::<PyResult<Vec<_>>>()?;
            let finished_ids = new_list(py, ids)?;
            let finished_before = inner.core.finished_since_last_step().len();
            let finished = inner.core.finish_requests_of(Some(&requests), status).map_err(core_err)?;
            debug_assert_eq!(finished.len(), finished_ids.len());
            inner.retire_finished_since(finished_before);
            Ok(finished_ids)
        })
    }

    /// Report whether the grammar of the structured-output request ``request_id`` compiled.
    /// The next waiting loop that reaches the request acts on it: a compiled grammar makes
    /// it an ordinary waiting request; a failed one makes ``finish_failed_grammars`` fail
    /// it. ``UnknownRequestError`` for an id not live, ``InvalidRequestError`` for a
    /// request without structured output or whose grammar was already reported; either
    /// changes nothing.
    fn resolve_grammar(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        compiled: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = request_id_arg(py, request_id)?;
        let compiled = bool_value(py, compiled, &"compiled", request_error)?;
        self.with_inner(py, |inner| inner.core.resolve_grammar(RequestRef::Id(&id), compiled).map_err(core_err))
    }

    /// Finish (``FINISHED_ERROR``) the requests whose grammar did not compile and that a
    /// waiting loop reached since the last call (vLLM fails them in its next
    /// ``update_from_output``); returns their ids. Their final records are then
    /// ``take_finished_requests``'s; the next ``schedule()`` reports them finished.
    fn finish_failed_grammars<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.finish_failed(py, Scheduler::finish_failed_grammars)
    }

    /// Finish (``FINISHED_ERROR``) the requests whose multimodal input met a cached encoder
    /// output of another size (an identifier reused for other content) in a loop since the
    /// last call (vLLM fails them in its next ``update_from_output``); returns their ids.
    /// Their final records are then ``take_finished_requests``'s.
    fn finish_encoder_mismatches<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.finish_failed(py, Scheduler::finish_encoder_mismatches)
    }

    /// The ids of the requests ``finish_encoder_mismatches`` will fail (a new list), in the
    /// order the loops met them (vLLM's ``encoder_cache_mismatch_reqs``).
    fn encoder_mismatch_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.with_inner(py, |inner| PyList::new(py, inner.core.encoder_mismatch_ids().map(|id| &**id)))
    }

    /// Forget every cached encoder output (vLLM's ``reset_encoder_cache``, after the
    /// model's weights change); the requests' references to them go too.
    fn reset_encoder_cache(&self, py: Python<'_>) -> PyResult<()> {
        self.with_inner(py, |inner| {
            inner.core.reset_encoder_cache();
            Ok(())
        })
    }

    /// The encoder cache: ``(free, freeable, cached)``: its free embedding slots, those
    /// plus the slots of outputs no request references, and the outputs it holds.
    fn encoder_cache_state(&self, py: Python<'_>) -> PyResult<(i64, i64, usize)> {
        self.with_inner(py, |inner| Ok(inner.core.encoder_cache_state()))
    }

    /// The encoder cache's outputs (a new list): ``(identifier, num_embeds, request_ids)``
    /// for each, by identifier, with the ids of the requests that reference it (none: it
    /// is kept until its room is needed); and the identifiers of those no request
    /// references, oldest (first evicted) first.
    fn encoder_cache_contents(&self, py: Python<'_>) -> PyResult<EncoderCacheContents> {
        self.with_inner(py, |inner| {
            let (entries, freeable) = inner.core.encoder_cache_contents();
            let entries = entries
                .into_iter()
                .map(|(identifier, num_embeds, holders)| {
                    (identifier.to_string(), num_embeds, holders.iter().map(|id| id.to_string()).collect())
                })
                .collect();
            Ok((entries, freeable.iter().map(|id| id.to_string()).collect()))
        })
    }

    /// With ``ec_connector``: the multimodal inputs whose encoder outputs a request's
    /// computed tokens passed (so the request no longer references them) since the last
    /// call, as ``(request_id, input_index)`` in that order: what vLLM tells its connector
    /// with ``update_state_after_free``. Empty without.
    fn take_passed_encoder_inputs(&self, py: Python<'_>) -> PyResult<Vec<(String, u32)>> {
        self.with_inner(py, |inner| {
            Ok(inner.core.take_passed_encoder_inputs().into_iter().map(|(id, i)| (id.to_string(), i)).collect())
        })
    }

    /// With ``kv_connector``: the blocks of KV-cache group ``group`` holding the computed
    /// tokens of the finished request ``request_id``, whose blocks stay out of the pool until
    /// ``release_kv_blocks`` (what a connector's ``request_finished`` is given, a list per
    /// group), as a new int32 array; None if it holds none, or there is no such group.
    #[pyo3(signature = (request_id, group=None), text_signature = "(self, request_id, group=0)")]
    fn held_kv_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        group: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let request_id = request_id_arg(py, request_id)?;
        let group = match group {
            Some(value) => {
                let g = int_value(py, value, &"group", request_error)?;
                usize::try_from(g)
                    .map_err(|_| request_error(py, format!("group={g}: must be a KV-cache group index (>= 0)")))?
            }
            None => 0,
        };
        let blocks = self.with_inner(py, |inner| {
            Ok(inner.core.held_kv_blocks(&request_id, group).map(|b| b.iter().map(|&id| id as i32).collect::<Vec<_>>()))
        })?;
        blocks.map(|b| crate::output::frozen(py, b)).transpose()
    }

    /// With ``kv_connector``: how many finished requests hold their KV blocks (until
    /// ``release_kv_blocks``).
    #[getter]
    fn num_held_kv_requests(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_held_kv_requests()))
    }

    /// With ``kv_connector``: ``(received, failed)``, the ids of the requests waiting for an
    /// asynchronous KV load that the runner reported received (vLLM's
    /// ``finished_recving_kv_req_ids``), and of those whose load failed and is to be
    /// recomputed (``failed_recving_kv_req_ids``), in waiting order: the next step promotes
    /// them.
    fn kv_loads_reported<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let (received, failed) = self.with_inner(py, |inner| Ok(inner.core.kv_loads_reported()))?;
        Ok((new_str_list(py, &received)?, new_str_list(py, &failed)?))
    }

    /// With ``kv_connector``: ids of the finished requests that hold their KV blocks,
    /// sorted.
    fn held_kv_request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with_inner(py, |inner| Ok(inner.core.held_kv_request_ids()))?;
        new_str_list(py, &ids)
    }

    /// Return the held blocks of the finished requests ``request_ids`` to the pool (a
    /// connector has sent them, or needs them no longer), each table tail first, in the
    /// order given. ``InvalidRequestError``, changing nothing, if one holds none or its
    /// load is in flight (``kv_load_in_flight``).
    fn release_kv_blocks(&self, py: Python<'_>, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = str_list(py, Some(request_ids), "request_ids")?;
        self.with_inner(py, |inner| {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            inner.core.release_kv_blocks(&ids).map_err(core_err)
        })
    }

    /// The runner's report of finished KV transfers (vLLM's ``finished_recving`` and
    /// ``finished_sending``): a request waiting for its asynchronous load
    /// (``WAITING_FOR_REMOTE_KVS``) that is received is promoted by the next ``schedule()``;
    /// a finished request's held blocks, received or sent, go back to the pool (received
    /// ones first, each list in its order). Ids that name neither are ignored.
    #[pyo3(signature = (finished_recving=None, finished_sending=None))]
    fn finish_kv_transfers(
        &self,
        py: Python<'_>,
        finished_recving: Option<&Bound<'_, PyAny>>,
        finished_sending: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let received = str_list(py, finished_recving, "finished_recving")?;
        let sent = str_list(py, finished_sending, "finished_sending")?;
        self.with_inner(py, |inner| {
            let received: Vec<&str> = received.iter().map(String::as_str).collect();
            let sent: Vec<&str> = sent.iter().map(String::as_str).collect();
            inner.core.finish_kv_transfers(&received, &sent);
            Ok(())
        })
    }

    /// The runner's report of failed KV loads (vLLM's ``failed_recving`` and
    /// ``invalid_block_ids``), given before the output of the oldest step in flight, as
    /// vLLM takes it: a request waiting for its load whose load failed keeps the tokens
    /// before its first failed block (none if it failed whole) and, once the load is
    /// reported done (``finish_kv_transfers``), computes the rest; a running request whose
    /// computed tokens lie in a failed block (a synchronous load's failure) keeps the
    /// tokens before it, and that step's output for it is dropped (if a later step in flight
    /// scheduled it too, it is preempted instead, every output in flight for it dropped,
    /// its blocks from the failed one out of the prefix cache, and its next admission asks
    /// the connector nothing). With the config's
    /// ``recompute_kv_load_failures`` off, returns the ids of the affected requests
    /// instead: finish them with ``FINISHED_ERROR`` once the step's output is applied
    /// (vLLM's policy ``"fail"``). Ids that name no request waiting for a load are ignored.
    /// ``InvalidRequestError``, changing nothing, for any ``invalid_block_ids`` with
    /// several KV-cache groups (a block id cannot be traced to requests there: loads fail
    /// by request, as in vLLM).
    #[pyo3(signature = (failed_recving=None, invalid_block_ids=None))]
    fn fail_kv_loads(
        &self,
        py: Python<'_>,
        failed_recving: Option<&Bound<'_, PyAny>>,
        invalid_block_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<String>> {
        let failed = str_list(py, failed_recving, "failed_recving")?;
        let blocks: Vec<u32> = match invalid_block_ids.filter(|v| !v.is_none()) {
            None => Vec::new(),
            Some(value) => value
                .try_iter()
                .and_then(|items| items.map(|item| item?.extract::<u32>()).collect::<PyResult<Vec<u32>>>())
                .map_err(|_| {
                    request_error(
                        py,
                        format!("invalid_block_ids: must be a collection of block ids (int), got {}", type_name(value)),
                    )
                })?,
        };
        self.with_inner(py, |inner| {
            let failed: Vec<&str> = failed.iter().map(String::as_str).collect();
            let ids = inner.core.fail_kv_loads(&failed, &blocks).map_err(core_err)?;
            Ok(ids.iter().map(|id| id.to_string()).collect())
        })
    }

    /// Whether request ``request_id`` waits for an asynchronous KV load the runner has
    /// not reported (``finish_kv_transfers``): live in ``WAITING_FOR_REMOTE_KVS``, or
    /// finished while it was (its blocks are then held until the load is reported, and
    /// ``release_kv_blocks`` refuses them).
    fn kv_load_in_flight(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let request_id = request_id_arg(py, request_id)?;
        self.with_inner(py, |inner| Ok(inner.core.kv_load_in_flight(&request_id)))
    }

    /// A snapshot of the live request ``request_id``; ``UnknownRequestError`` if no
    /// live request has that id.
    fn get_request(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<PyRequest> {
        let request_id = request_id_arg(py, request_id)?;
        self.with_inner(py, |inner| Ok(PyRequest::snapshot(inner.core.get_request(&request_id).map_err(core_err)?)))
    }

    /// The final state of each request the latest ``update_from_output`` or
    /// ``finish_requests`` call finished, in the order they finished: one ``Request``
    /// snapshot each (status, counters and tokens as they were; its blocks are freed).
    /// Taking them leaves none; the next such call drops those nobody took.
    fn take_finished_requests(&self, py: Python<'_>) -> PyResult<Vec<PyRequest>> {
        let records = self.with_inner(py, |inner| Ok(inner.core.take_last_finished()))?;
        Ok(records.iter().map(PyRequest::snapshot).collect())
    }

    /// Whether any request is running or waiting.
    fn has_unfinished_requests(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_inner(py, |inner| Ok(inner.core.has_unfinished_requests()))
    }

    /// How many requests are running or waiting.
    fn get_num_unfinished_requests(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.get_num_unfinished_requests()))
    }

    /// Whether any request is unfinished, or finished but not yet reported by a
    /// ``schedule()``.
    fn has_requests(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_inner(py, |inner| Ok(inner.core.has_requests()))
    }

    /// Whether any request finished since the last ``schedule()``, which will report it.
    fn has_finished_requests(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_inner(py, |inner| Ok(inner.core.has_finished_requests()))
    }

    /// How many of the waiting requests a waiting loop set aside (a LoRA adapter past
    /// ``max_loras``, output from before a preemption still in flight, no token it could
    /// schedule) and none has admitted since: vLLM's ``num_skipped_waiting_reqs``.
    #[getter]
    fn num_skipped_waiting(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_skipped_waiting()))
    }

    /// Streaming-input sessions waiting for their next input
    /// (``WAITING_FOR_STREAMING_REQ``): counted as waiting, but not unfinished work, and each
    /// holds one of ``max_num_seqs``' slots (vLLM's ``num_waiting_for_streaming_input``).
    #[getter]
    fn num_waiting_for_streaming_input(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_waiting_for_streaming_input()))
    }

    /// ``(running, waiting)``.
    fn get_request_counts(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        self.with_inner(py, |inner| Ok(inner.core.get_request_counts()))
    }

    /// vLLM's pause state: 0 unpaused, 1 no new admissions, 2 nothing scheduled.
    #[getter]
    fn pause_state(&self, py: Python<'_>) -> PyResult<u8> {
        self.with_inner(py, |inner| Ok(inner.core.pause_state() as u8))
    }

    /// Set the pause state (0 unpaused, 1 no new admissions, 2 nothing scheduled).
    fn set_pause_state(&self, py: Python<'_>, pause_state: &Bound<'_, PyAny>) -> PyResult<()> {
        let pause_state = int_value(py, pause_state, &"pause_state", request_error)?;
        let Some(state) = llmsched_core::PauseState::from_value(pause_state) else {
            return Err(request_error(py, format!("pause_state={pause_state}: must be 0, 1 or 2")));
        };
        self.with_inner(py, |inner| {
            inner.core.set_pause_state(state);
            Ok(())
        })
    }

    /// ``schedule()`` calls so far (vLLM's ``current_step``).
    #[getter]
    fn current_step(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_inner(py, |inner| Ok(inner.core.current_step()))
    }

    /// With ``defer_block_free``, ``(sched_step_seq, processed_step_seq)``: the steps with
    /// tokens scheduled so far and those whose output is applied (vLLM's counters of those
    /// names); ``(0, 0)`` without.
    #[getter]
    fn step_seqs(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        self.with_inner(py, |inner| Ok(inner.core.step_seqs()))
    }

    /// The frees that wait for steps in flight (``defer_block_free``; a new list), oldest
    /// first: ``(step, block_ids)``, a request's blocks in the order they go back once the
    /// step numbered ``step`` (see ``step_seqs``) has its output applied (vLLM's
    /// ``deferred_frees``).
    fn deferred_frees(&self, py: Python<'_>) -> PyResult<Vec<(u64, Vec<u32>)>> {
        self.with_inner(py, |inner| {
            Ok(inner.core.deferred_frees().map(|(step, blocks)| (step, blocks.to_vec())).collect())
        })
    }

    /// The prefill cadence's counters, ``(num_executed_steps, last_prefill_step)``: steps
    /// that scheduled tokens, and the count of them at the last one that carried prefill (a
    /// whole interval back before any).
    #[getter]
    fn prefill_cadence(&self, py: Python<'_>) -> PyResult<(i64, i64)> {
        self.with_inner(py, |inner| Ok(inner.core.prefill_cadence()))
    }

    /// The last step that could admit left requests waiting that were not set aside: the
    /// waiting requests outgrew it, and prefill is not held back (vLLM's
    /// ``prefill_capacity_bound``).
    #[getter]
    fn prefill_capacity_bound(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_inner(py, |inner| Ok(inner.core.prefill_capacity_bound()))
    }

    /// With async scheduling, the steps between two decodes of one request (1: every
    /// step; 0: no decode cadence, the default); see ``set_decode_stagger``.
    #[getter]
    fn decode_stagger(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_inner(py, |inner| Ok(inner.core.decode_stagger()))
    }

    /// With async scheduling, a request decoded in step ``t`` is not decoded again before
    /// step ``t + steps``, its ``next_decode_eligible_step`` (vLLM's V2 model runner: with
    /// pipeline parallelism, one decode per request per trip through the stages); 1
    /// decodes it every step. 0, the default: no decode cadence (the bound is not
    /// recorded). Takes effect from the next step. ``ConfigError`` naming the value outside
    /// [0, 1024].
    fn set_decode_stagger(&self, py: Python<'_>, steps: &Bound<'_, PyAny>) -> PyResult<()> {
        let steps = int_value(py, steps, &"decode_stagger", config_error)?;
        self.with_inner(py, |inner| inner.core.set_decode_stagger(steps).map_err(core_err))
    }

    /// The fraction of usable KV blocks in use, in [0, 1].
    fn get_kv_cache_usage(&self, py: Python<'_>) -> PyResult<f64> {
        self.with_inner(py, |inner| Ok(inner.core.kv_cache_usage()))
    }

    /// KV blocks in the free queue (cached ones included: they are reusable).
    #[getter]
    fn num_free_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_free_blocks()))
    }

    /// KV blocks held by requests (the null block and the free queue left out): the
    /// distinct KV memory a step scheduled now reads, which ``llmsched.steps`` logs.
    #[getter]
    fn num_used_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_used_blocks()))
    }

    /// Scheduled steps with requests whose output has not been applied yet.
    #[getter]
    fn num_steps_in_flight(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_steps_in_flight()))
    }

    /// Counters over the scheduler's life, as a dict:
    ///
    /// - ``num_steps``: ``schedule()`` calls;
    /// - ``num_preemptions``: requests preempted;
    /// - ``num_draft_tokens``, ``num_accepted_tokens``: draft slots scheduled and
    ///   drafts the runner accepted;
    /// - ``prefix_cache_requests``, ``prefix_cache_queries``, ``prefix_cache_hits``:
    ///   prefix-cache lookups at first admission (requests, prompt tokens looked up,
    ///   tokens found);
    /// - ``prefix_cache_preempted_requests``, ``prefix_cache_preempted_queries``,
    ///   ``prefix_cache_preempted_hits``: the same at re-admission after a preemption.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (stats, prefix) =
            self.with_inner(py, |inner| Ok((inner.core.stats().clone(), inner.core.prefix_cache_stats().clone())))?;
        stats_dict(py, &stats, &prefix)
    }

    /// Forget every cached prefix block. With ``reset_running_requests``, first
    /// preempt every running request (their output in flight is dropped). Returns
    /// False, changing nothing, while any block is in use.
    #[pyo3(signature = (reset_running_requests=None), text_signature = "(self, reset_running_requests=False)")]
    fn reset_prefix_cache(&self, py: Python<'_>, reset_running_requests: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let reset_running = match reset_running_requests {
            Some(v) => bool_value(py, v, &"reset_running_requests", request_error)?,
            None => false,
        };
        self.with_inner(py, |inner| Ok(inner.core.reset_prefix_cache(reset_running)))
    }

    /// The prefix cache's changes since the last call, oldest first, as tuples:
    /// ``("stored", request_id, first_block, block_ids, group)`` (the blocks now cached in
    /// KV-cache group ``group`` hold the request's full blocks ``first_block, first_block +
    /// 1, ...``: their content is the request's tokens there; 0 for a sliding-window block
    /// that did not enter the cache), ``("reused", request_id, num_blocks, group)`` (a prefix
    /// lookup of a request added with ``report_reused_blocks`` hit its first ``num_blocks``
    /// blocks, one tuple per group), ``("removed", block_id, group)`` (evicted, or its KV
    /// will never be computed) and ``("cleared",)`` (``reset_prefix_cache``). ``schedule``, ``update_from_output`` and
    /// ``reset_prefix_cache`` make them; always empty unless the config's
    /// ``enable_kv_cache_events``. Take them before the requests they name are let go: a
    /// request finished by ``update_from_output`` is still reachable then through
    /// ``take_finished_requests``.
    fn take_kv_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.with_inner(py, |inner| Ok(inner.core.take_kv_events()))?;
        let items = events
            .into_iter()
            .map(|event| -> PyResult<Bound<'py, PyAny>> {
                Ok(match event {
                    KvEvent::Stored { request_id, group, first_block, blocks } => {
                        ("stored", &*request_id, first_block, blocks, group).into_pyobject(py)?.into_any()
                    }
                    KvEvent::Reused { request_id, group, num_blocks } => {
                        ("reused", &*request_id, num_blocks, group).into_pyobject(py)?.into_any()
                    }
                    KvEvent::Removed { block, group } => ("removed", block, group).into_pyobject(py)?.into_any(),
                    KvEvent::Cleared => ("cleared",).into_pyobject(py)?.into_any(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        new_list(py, items)
    }

    /// The KV blocks evicted since the last call among those the config samples
    /// (``kv_cache_metrics_sample``), in eviction order, as tuples ``(lifetime_seconds,
    /// idle_seconds, reuse_gaps_seconds)``: how long each lived since the pool handed it
    /// out, since its last read (a prefix hit), and the gaps between its last reads (up to
    /// three); vLLM's ``KVCacheEvictionEvent``. Always empty when it samples none.
    fn take_kv_cache_eviction_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.with_inner(py, |inner| Ok(inner.core.take_kv_cache_eviction_events()))?;
        let items = events
            .into_iter()
            .map(|e| -> PyResult<Bound<'py, PyAny>> {
                let gaps = PyTuple::new(py, e.reuse_gaps_seconds)?;
                Ok((e.lifetime_seconds, e.idle_seconds, gaps).into_pyobject(py)?.into_any())
            })
            .collect::<PyResult<Vec<_>>>()?;
        new_list(py, items)
    }

    /// Running request ids, in running order.
    fn running_request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with_inner(py, |inner| Ok(inner.core.running_ids()))?;
        new_str_list(py, &ids)
    }

    /// How many of ``waiting_request_ids()`` (the first ones) hold KV blocks, a KV load's
    /// or computed tokens (vLLM's ``kv_holding_waiting``).
    #[getter]
    fn num_kv_holding_waiting(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |inner| Ok(inner.core.num_kv_holding_waiting()))
    }

    /// Waiting request ids, in the order the waiting loop would consider them: those
    /// holding KV blocks first (``num_kv_holding_waiting``).
    fn waiting_request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with_inner(py, |inner| Ok(inner.core.waiting_ids()))?;
        new_str_list(py, &ids)
    }

    /// How many hold KV block ``block_id`` now (requests, and finished requests whose
    /// blocks a KV connector holds); ``InvalidRequestError`` if the pool has no such block.
    fn block_ref_count(&self, py: Python<'_>, block_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        let block = block_id_arg(py, block_id)?;
        self.with_inner(py, |inner| Ok(inner.core.block_ref_count(block)))?
            .ok_or_else(|| request_error(py, format!("block_id={block}: the pool has no such block")))
    }

    /// The hash KV block ``block_id`` is in the prefix cache under now (llmsched's 128-bit
    /// hash, as in ``Request.block_hashes``), or None if it is not cached;
    /// ``InvalidRequestError`` if the pool has no such block.
    fn cached_block_hash(&self, py: Python<'_>, block_id: &Bound<'_, PyAny>) -> PyResult<Option<u128>> {
        let block = block_id_arg(py, block_id)?;
        self.with_inner(py, |inner| Ok(inner.core.block_ref_count(block).map(|_| inner.core.cached_block_hash(block))))?
            .ok_or_else(|| request_error(py, format!("block_id={block}: the pool has no such block")))
    }

    /// The KV block cached under ``block_hash`` (llmsched's 128-bit hash, as in
    /// ``Request.block_hashes``) in KV-cache group ``group`` now, or None (also in a group
    /// the pool does not have).
    #[pyo3(signature = (block_hash, group=None))]
    fn cached_block(
        &self,
        py: Python<'_>,
        block_hash: &Bound<'_, PyAny>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u32>> {
        let (hash, group) = cached_block_args(py, block_hash, group)?;
        self.with_inner(py, |inner| Ok(inner.core.cached_block(hash, group)))
    }

    /// The prefix-cache hit a request with this prompt and these keys would find now, were
    /// it added (vLLM's ``KVCacheManager.get_computed_blocks`` for a request not added):
    /// ``(block_ids, num_tokens, shared_prefix_boundary)``: the hit's blocks, one list per
    /// KV-cache group, the tokens they hold (none with ``skip_reading_prefix_cache``), and
    /// where the prefix a full-attention group cached past the hit ends (0 if none). The
    /// arguments are read as ``add_request`` reads them. Changes nothing: no request is
    /// added, and no stats or events are recorded.
    #[pyo3(signature = (prompt_token_ids, *, cache_salt=None, lora_id=None, mm_inputs=None,
                        prompt_embeds_keys=None, skip_reading_prefix_cache=None),
           text_signature = "(self, prompt_token_ids, *, cache_salt=None, lora_id=None, mm_inputs=None, \
                             prompt_embeds_keys=(), skip_reading_prefix_cache=False)")]
    #[allow(clippy::too_many_arguments)]
    fn probe_prefix_cache<'py>(
        &self,
        py: Python<'py>,
        prompt_token_ids: &Bound<'py, PyAny>,
        cache_salt: Option<&Bound<'py, PyAny>>,
        lora_id: Option<&Bound<'py, PyAny>>,
        mm_inputs: Option<&Bound<'py, PyAny>>,
        prompt_embeds_keys: Option<&Bound<'py, PyAny>>,
        skip_reading_prefix_cache: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyList>, i64, i64)> {
        let config = self.current_config();
        let prompt = token_list(py, prompt_token_ids, &"prompt_token_ids", request_error, &config.prompt_limit())?;
        let mut new = NewRequest::new("probe", prompt, 1);
        new.cache_salt = cache_salt_arg(py, cache_salt)?;
        new.lora_id = optional_int_arg(py, lora_id, "lora_id")?;
        new.mm_inputs = mm_inputs_arg(py, &config, mm_inputs)?;
        new.prompt_embeds_keys = prompt_embeds_keys_arg(py, &config, prompt_embeds_keys)?;
        new.skip_reading_prefix_cache = flag_arg(py, skip_reading_prefix_cache, "skip_reading_prefix_cache")?;
        let hit = self.with_inner(py, |inner| inner.core.probe_prefix_cache(new).map_err(core_err))?;
        // The hit's blocks are one run of the same length per group, group after group.
        let num_groups = config.kv_cache_groups().len();
        let per_group = hit.blocks.len() / num_groups;
        let groups = PyList::empty(py);
        for g in 0..num_groups {
            groups.append(PyList::new(py, &hit.blocks[g * per_group..(g + 1) * per_group])?)?;
        }
        Ok((groups, hit.tokens, hit.shared_prefix_boundary))
    }

    /// Ids of the requests finished since the last ``schedule()``, in the order they
    /// finished: what the next step reports (vLLM's ``finished_req_ids``).
    fn finished_since_last_step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids: Vec<Arc<str>> = self.with_inner(py, |inner| {
            Ok(inner.core.finished_since_last_step().iter().map(|(_, id)| id.clone()).collect())
        })?;
        new_str_list(py, &ids)
    }

    /// Ids of the waiting requests a waiting loop set aside and none has admitted since
    /// (vLLM's ``deferred_waiting``; ``num_skipped_waiting`` of them), in waiting order.
    fn skipped_waiting_request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with_inner(py, |inner| Ok(inner.core.skipped_waiting_ids()))?;
        new_str_list(py, &ids)
    }

    /// The free-block queue, head first (blocks are reused from the head).
    fn free_block_queue<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let queue = self.with_inner(py, |inner| Ok(inner.core.free_block_queue()))?;
        new_list(py, queue.into_iter().map(|block| new_int(py, block)).collect::<PyResult<_>>()?)
    }

    /// Check every invariant of the whole state: the capacity rule, queues and
    /// statuses, counters, block tables, reference counts, the free queue and the
    /// prefix cache's hashes.
    ///
    /// O(everything): meant for tests and debugging, not the hot path.
    /// Raises ``InvariantError`` naming the first broken one.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.with_inner(py, |inner| {
            let core = &inner.core;
            py.detach(|| core.check_invariants()).map_err(core_err)
        })
    }

    /// A deterministic dump of the whole state, for equality checks in tests.
    fn debug_snapshot(&self, py: Python<'_>) -> PyResult<String> {
        self.with_inner(py, |inner| Ok(inner.core.debug_snapshot()))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.with_inner(py, |inner| {
            let (running, waiting) = inner.core.get_request_counts();
            Ok(format!("Scheduler(running={running}, waiting={waiting}, free_blocks={})", inner.core.num_free_blocks()))
        })
    }
}

#[allow(dead_code)]
fn _assert_traits() {
    fn sync<T: Sync + Send>() {}
    sync::<PyScheduler>();
    let _ = |a: &PyReadonlyArray1<i32>| a.len();
}

/// The scheduler's counters as ``Scheduler.stats()`` (and ``Replay.stats()``) give them.
pub fn stats_dict<'py>(
    py: Python<'py>,
    stats: &llmsched_core::SchedulerStats,
    prefix: &llmsched_core::PrefixCacheStats,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("num_steps", stats.num_steps)?;
    dict.set_item("num_preemptions", stats.num_preemptions)?;
    dict.set_item("num_draft_tokens", stats.num_draft_tokens)?;
    dict.set_item("num_accepted_tokens", stats.num_accepted_tokens)?;
    dict.set_item("prefix_cache_requests", prefix.requests)?;
    dict.set_item("prefix_cache_queries", prefix.queries)?;
    dict.set_item("prefix_cache_hits", prefix.hits)?;
    dict.set_item("prefix_cache_preempted_requests", prefix.preempted_requests)?;
    dict.set_item("prefix_cache_preempted_queries", prefix.preempted_queries)?;
    dict.set_item("prefix_cache_preempted_hits", prefix.preempted_hits)?;
    Ok(dict)
}
