//! The objects a step hands to Python: `SchedulerOutput`, `RequestOutput`,
//! and the `Request` snapshot of `get_request`.

use std::sync::Arc;

use llmsched_core::{Request, RequestStatus};

use std::sync::{Mutex, OnceLock, PoisonError};

use numpy::{npyffi, PyArray1, PyArrayDescrMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::ids::StepIds;

/// `llmsched.status.RequestStatus` members, by value (index 0 unused).
static STATUS_MEMBERS: PyOnceLock<Vec<Py<PyAny>>> = PyOnceLock::new();

/// The `llmsched.status.RequestStatus` member of `status`, looked up by value.
pub fn status_object(py: Python<'_>, status: RequestStatus) -> PyResult<Bound<'_, PyAny>> {
    let members = STATUS_MEMBERS.get_or_try_init(py, || -> PyResult<Vec<Py<PyAny>>> {
        let enum_class = py.import("llmsched.status")?.getattr("RequestStatus")?;
        let mut members: Vec<Py<PyAny>> = (0..=RequestStatus::ALL.len()).map(|_| py.None()).collect();
        for &s in RequestStatus::ALL {
            if let Some(slot) = members.get_mut(s as usize) {
                *slot = enum_class.call1((s as u8,))?.unbind();
            }
        }
        Ok(members)
    })?;
    match members.get(status as usize) {
        Some(member) => Ok(member.bind(py).clone()),
        None => py.import("llmsched.status")?.getattr("RequestStatus")?.call1((status as u8,)),
    }
}

/// The statuses as `(name, value, finish reason)`, exported as `_core.REQUEST_STATUSES`
/// for `llmsched.status` (its enum is checked against it by a test).
pub fn request_statuses(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows: Vec<Bound<'_, PyTuple>> = RequestStatus::ALL
        .iter()
        .map(|&s| (s.name(), s as u8, s.finish_reason()).into_pyobject(py))
        .collect::<PyResult<_>>()?;
    PyTuple::new(py, rows)
}

/// The buffer behind a column array: the step's `Vec`, moved in, never written again
/// (the array is read-only). A lock only so that a failed array can hand the `Vec` back.
#[pyclass(frozen, module = "llmsched._core")]
struct ColumnBuffer(Mutex<Vec<i32>>);

/// A read-only int32 array that owns `values` (moved, not copied). Every empty one is the
/// same shared array: a decode step has empty columns, and making an array costs as many
/// instructions as two or three requests' whole decode step. On error (Python out of
/// memory) `values` comes back with it, unchanged.
pub fn frozen_array(py: Python<'_>, values: Vec<i32>) -> Result<Py<PyArray1<i32>>, (PyErr, Vec<i32>)> {
    static EMPTY: PyOnceLock<Py<PyArray1<i32>>> = PyOnceLock::new();
    if values.is_empty() {
        return match EMPTY.get_or_try_init(py, || new_frozen_array(py, Vec::new()).map_err(|(e, _)| e)) {
            Ok(empty) => Ok(empty.clone_ref(py)),
            Err(error) => Err((error, values)),
        };
    }
    new_frozen_array(py, values)
}

/// `frozen_array` for the getters, which build their values anew on every call.
pub fn frozen<'py>(py: Python<'py>, values: Vec<i32>) -> PyResult<Bound<'py, PyArray1<i32>>> {
    frozen_array(py, values).map(|array| array.into_bound(py)).map_err(|(error, _)| error)
}

fn new_frozen_array(py: Python<'_>, values: Vec<i32>) -> Result<Py<PyArray1<i32>>, (PyErr, Vec<i32>)> {
    // The owner first (an allocation that can fail), then the values in it: they never
    // move again, so the array may point into them.
    let owner = match Bound::new(py, ColumnBuffer(Mutex::new(Vec::new()))) {
        Ok(owner) => owner,
        Err(error) => return Err((error, values)),
    };
    let buffer = &owner.get().0;
    let lock = || buffer.lock().unwrap_or_else(PoisonError::into_inner);
    let (data, len) = {
        let mut buffer = lock();
        *buffer = values;
        (buffer.as_ptr(), buffer.len())
    };
    let mut dims = [len as npyffi::npy_intp];
    let mut strides = [size_of::<i32>() as npyffi::npy_intp];
    // SAFETY: the GIL is held. `PyArray_NewFromDescr` steals the dtype reference and
    // returns a new reference or NULL with an exception set; with `data` given and no
    // WRITEABLE flag the array is read-only and views `len` int32 at `data`, which the
    // owner keeps alive and unmoved: `PyArray_SetBaseObject` hands it the owner (stealing
    // the reference given, also on failure).
    unsafe {
        let array = npyffi::PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            numpy::dtype::<i32>(py).into_dtype_ptr(),
            1,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
            data as *mut std::ffi::c_void,
            npyffi::NPY_ARRAY_C_CONTIGUOUS | npyffi::NPY_ARRAY_ALIGNED,
            std::ptr::null_mut(),
        );
        let array = match Bound::from_owned_ptr_or_err(py, array) {
            Ok(array) => array,
            Err(error) => return Err((error, std::mem::take(&mut *lock()))),
        };
        if npyffi::PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner.clone().into_ptr()) < 0 {
            let error = PyErr::fetch(py);
            drop(array);
            return Err((error, std::mem::take(&mut *lock())));
        }
        Ok(array.cast_into_unchecked::<PyArray1<i32>>().unbind())
    }
}

/// What one ``schedule()`` step decided. Immutable.
///
/// Every array is int32, built in Rust and moved into numpy without a copy;
/// arrays are read-only (every empty one is the same shared array). Per-request
/// arrays are aligned with ``req_ids``: running requests first (in running
/// order), then this step's admissions.
#[pyclass(frozen, module = "llmsched", name = "SchedulerOutput")]
pub struct PySchedulerOutput {
    pub scheduler_uid: u64,
    /// The step's number, counting from 1; its output must be applied in this order.
    #[pyo3(get)]
    pub step_id: u64,
    /// The scheduled requests, in the order of the per-request arrays.
    #[pyo3(get)]
    pub req_ids: Py<PyList>,
    /// The same id objects, held apart: `update_from_output` matches runner rows
    /// against these, so a caller mutating `req_ids` cannot misroute tokens; the
    /// step's `RequestOutputs` share them.
    pub entry_ids: Arc<StepIds>,
    /// ``n`` per request: tokens to compute in this step (>= 1).
    #[pyo3(get)]
    pub num_scheduled_tokens: Py<PyArray1<i32>>,
    /// ``C`` per request before this step (prefix hits included).
    #[pyo3(get)]
    pub num_computed_tokens: Py<PyArray1<i32>>,
    /// Draft slots scheduled per request (0 if none).
    #[pyo3(get)]
    pub num_spec_tokens: Py<PyArray1<i32>>,
    /// All scheduled drafts, flat, split by ``num_spec_tokens``; -1 is a placeholder.
    #[pyo3(get)]
    pub spec_token_ids: Py<PyArray1<i32>>,
    /// Output tokens per request before this step, placeholders included.
    #[pyo3(get)]
    pub num_output_tokens: Py<PyArray1<i32>>,
    /// Block ids per request in ``block_ids``: the whole table for new and
    /// resumed requests (replace), the newly allocated blocks otherwise (append).
    /// With several KV-cache groups, one run of counts per group, group after
    /// group (``len(req_ids)`` each).
    #[pyo3(get)]
    pub num_block_ids: Py<PyArray1<i32>>,
    /// The block ids counted by ``num_block_ids``, flat; a sliding-window
    /// group's table holds the null block (0) where blocks left the window.
    #[pyo3(get)]
    pub block_ids: Py<PyArray1<i32>>,
    /// For new and resumed requests, how many tokens they hold (prompt and
    /// outputs so far); 0 for the others.
    #[pyo3(get)]
    pub num_all_token_ids: Py<PyArray1<i32>>,
    /// The tokens counted by ``num_all_token_ids``, flat.
    #[pyo3(get)]
    pub all_token_ids: Py<PyArray1<i32>>,
    /// The LoRA adapters of the scheduled requests, ascending, each once (at most
    /// ``max_loras``; empty without LoRA). Not per request.
    #[pyo3(get)]
    pub lora_ids: Py<PyArray1<i32>>,
    /// The rows (indices into ``req_ids``) whose sampled token a grammar constrains:
    /// structured-output requests whose chunk reaches the end of their tokens, ascending
    /// (the rows of the step's grammar bitmask). Empty while no request uses structured
    /// output.
    #[pyo3(get)]
    pub structured_output_rows: Py<PyArray1<i32>>,
    /// With Mamba KV-cache groups, the attention groups' blocks allocated since the
    /// previous step, group after group, which the runner zeroes before use (vLLM's
    /// ``new_block_ids_to_zero``). Empty without Mamba groups. Not per request.
    #[pyo3(get)]
    pub new_block_ids_to_zero: Py<PyArray1<i32>>,
    /// With pipeline stages and synchronous scheduling, each row's count of tokens in
    /// ``new_token_ids`` (``n`` less its draft slots); empty otherwise.
    #[pyo3(get)]
    pub num_new_token_ids: Py<PyArray1<i32>>,
    /// The rows' tokens from ``C`` on, row after row (see ``num_new_token_ids``): the first
    /// pipeline stage sees no sampled token, so the step sends them (vLLM's
    /// ``CachedRequestData.new_token_ids``).
    #[pyo3(get)]
    pub new_token_ids: Py<PyArray1<i32>>,
    /// The multimodal inputs the step encodes, one entry per input: its row (an index into
    /// ``req_ids``), rows ascending (vLLM's ``scheduled_encoder_inputs``). Empty without
    /// multimodal inputs.
    #[pyo3(get)]
    pub encoder_input_rows: Py<PyArray1<i32>>,
    /// Each of those inputs' index among its request's ``mm_inputs``.
    #[pyo3(get)]
    pub encoder_input_ids: Py<PyArray1<i32>>,
    /// With ``ec_connector``, the multimodal inputs whose encoder outputs the connector
    /// loads for the step instead of the encoder computing them (``has_cache_item``), in
    /// the same layout: each one's row, rows ascending. Empty otherwise.
    #[pyo3(get)]
    pub external_encoder_input_rows: Py<PyArray1<i32>>,
    /// Each of those inputs' index among its request's ``mm_inputs``.
    #[pyo3(get)]
    pub external_encoder_input_ids: Py<PyArray1<i32>>,
    /// With ``kv_connector``, one entry per request admitted from a waiting queue in this
    /// step, in admission order (the last rows of ``req_ids``): the tokens past its
    /// prefix-cache hit that the external KV source loads (counted in its
    /// ``num_computed_tokens``), or -1 for a request that held computed tokens and asked
    /// none. Empty without a connector.
    #[pyo3(get)]
    pub num_external_computed_tokens: Py<PyArray1<i32>>,
    /// The identifiers of the encoder outputs evicted from the encoder cache since the
    /// previous step: the runner frees them (vLLM's ``free_encoder_mm_hashes``).
    #[pyo3(get)]
    pub freed_encoder_outputs: Py<PyList>,
    /// With ``kv_connector``, the asynchronous KV loads this step's waiting loop started,
    /// in its order: ``(request_id, num_external_tokens, num_admitted_before)`` (the tokens
    /// past its prefix-cache hit the connector loads; how many requests the loop admitted
    /// before it, i.e. where it falls among ``num_external_computed_tokens``). Each request
    /// waits in ``WAITING_FOR_REMOTE_KVS``, holding its blocks (``get_request``), until
    /// ``finish_kv_transfers`` reports it received. Empty otherwise.
    #[pyo3(get)]
    pub kv_loads: Py<PyList>,
    /// Async scheduling: one of those rows awaits an earlier step's output, so the step's
    /// bitmask can be built only once that output is applied (vLLM's
    /// ``pending_structured_output_tokens``).
    #[pyo3(get)]
    pub pending_structured_output_tokens: bool,
    /// No request of the step can use drafts proposed after it (each is a non-final
    /// prefill chunk or samples its last output token even if every draft is rejected):
    /// a drafter may skip proposing (vLLM's ``skip_drafts``). True for an empty step and
    /// without speculative decoding.
    #[pyo3(get)]
    pub drafts_unused: bool,
    /// The sum of ``num_scheduled_tokens``.
    #[pyo3(get)]
    pub total_num_scheduled_tokens: i64,
    /// Requests scheduled for the first time in this step.
    #[pyo3(get)]
    pub new_req_ids: Py<PyList>,
    /// Preempted requests scheduled again in this step (from scratch, or from a
    /// prefix-cache hit).
    #[pyo3(get)]
    pub resumed_req_ids: Py<PyList>,
    /// Running requests scheduled in this step that the previous step did not schedule.
    #[pyo3(get)]
    pub rescheduled_req_ids: Py<PyList>,
    /// Requests preempted since the previous ``schedule()``, this step included.
    #[pyo3(get)]
    pub preempted_req_ids: Py<PyList>,
    /// Requests that finished since the previous ``schedule()`` (aborts included).
    #[pyo3(get)]
    pub finished_req_ids: Py<PyList>,
}

#[pymethods]
impl PySchedulerOutput {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.req_ids.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "SchedulerOutput(step_id={}, {} requests, {} tokens, {} new, {} resumed, {} preempted, {} finished)",
            self.step_id,
            self.req_ids.bind(py).len(),
            self.total_num_scheduled_tokens,
            self.new_req_ids.bind(py).len(),
            self.resumed_req_ids.bind(py).len(),
            self.preempted_req_ids.bind(py).len(),
            self.finished_req_ids.bind(py).len(),
        )
    }
}

/// A request's new tokens: inline when few (one per step is the common case),
/// so building an output allocates nothing beyond the Python object.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Tokens {
    Inline { len: u8, buf: [i32; 4] },
    Heap(Box<[i32]>),
}

impl Tokens {
    pub fn new(tokens: &[i32]) -> Self {
        if tokens.len() <= 4 {
            let mut buf = [0; 4];
            buf[..tokens.len()].copy_from_slice(tokens);
            Tokens::Inline { len: tokens.len() as u8, buf }
        } else {
            Tokens::Heap(tokens.into())
        }
    }

    pub fn as_slice(&self) -> &[i32] {
        match self {
            Tokens::Inline { len, buf } => &buf[..*len as usize],
            Tokens::Heap(tokens) => tokens,
        }
    }
}

/// What one step produced for one request.
#[pyclass(frozen, module = "llmsched", name = "RequestOutput")]
pub struct PyRequestOutput {
    /// The request's id.
    #[pyo3(get)]
    pub request_id: Py<PyString>,
    pub new_token_ids: Tokens,
    pub status: RequestStatus,
    /// The stop token id that finished the request, if one did.
    #[pyo3(get)]
    pub stop_reason: Option<i32>,
}

#[pymethods]
impl PyRequestOutput {
    /// The tokens this step delivered to the request (after a stop, none past it).
    #[getter]
    fn new_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.new_token_ids.as_slice())
    }

    /// The request's status after the step.
    #[getter]
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        status_object(py, self.status)
    }

    /// Whether the request finished in this step.
    #[getter]
    fn finished(&self) -> bool {
        self.status.is_finished()
    }

    /// vLLM's finish reason (``"stop"``, ``"length"``, ``"abort"``...), or None.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        if self.status.is_finished() {
            self.status.finish_reason()
        } else {
            None
        }
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(other) = other.cast::<PyRequestOutput>() else { return Ok(false) };
        let other = other.get();
        Ok(self.new_token_ids == other.new_token_ids
            && self.status == other.status
            && self.stop_reason == other.stop_reason
            && self.request_id.bind(py).as_any().eq(other.request_id.bind(py))?)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        let id_hash = self.request_id.bind(py).hash()?;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&(id_hash, &self.new_token_ids, self.status as u8, self.stop_reason), &mut hasher);
        Ok(std::hash::Hasher::finish(&hasher) as isize)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "RequestOutput(request_id={}, new_token_ids={:?}, status={}{})",
            self.request_id.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            self.new_token_ids.as_slice(),
            self.status.name(),
            self.stop_reason.map(|t| format!(", stop_reason={t}")).unwrap_or_default(),
        )
    }
}

/// The outputs of one step: a sequence of ``RequestOutput`` (a request that
/// produced tokens or finished), stored as columns.
///
/// Elements are built when accessed, so a caller that reads the columns
/// (``req_ids``, ``new_token_ids``, ``num_new_tokens``, ``statuses``) never pays
/// for one Python object per request. The column properties copy into new
/// read-only numpy arrays on each access.
#[pyclass(frozen, sequence, module = "llmsched", name = "RequestOutputs")]
pub struct PyRequestOutputs {
    /// The ids of the step the outputs answer, shared with its `SchedulerOutput`: an
    /// output names its request by position, without a reference count per request.
    pub step_ids: Arc<StepIds>,
    /// One row per output, pushed in one piece as the update hands each event over; set
    /// once the update is applied (the object is made before, so that nothing can fail
    /// after the update).
    pub rows: OnceLock<Vec<OutputRow>>,
    /// The runner's sampled tokens (this call's copy); output `i` delivered
    /// `tokens[rows[i].start..][..rows[i].len]` (tokens past a stop are not delivered).
    pub tokens: Vec<i32>,
}

/// One request's output in a step.
#[derive(Clone, Copy, Debug)]
pub struct OutputRow {
    /// Its request's position in the step's ids.
    pub entry: u32,
    /// Where its delivered tokens start in the sampled tokens, and how many there are.
    pub start: u32,
    pub len: u32,
    pub status: RequestStatus,
    pub stop_reason: Option<i32>,
    pub num_cached_blocks: i32,
}

impl PyRequestOutputs {
    fn rows(&self) -> &[OutputRow] {
        self.rows.get().map_or(&[], Vec::as_slice)
    }

    /// The id of output `i`'s request.
    fn request_id<'a, 'py>(&'a self, py: Python<'py>, i: usize) -> Borrowed<'a, 'py, PyString> {
        self.step_ids.get(py, self.rows()[i].entry as usize)
    }

    fn len(&self) -> usize {
        self.rows().len()
    }

    /// The tokens output `i` delivered.
    fn delivered(&self, i: usize) -> &[i32] {
        let row = &self.rows()[i];
        &self.tokens[row.start as usize..][..row.len as usize]
    }

    fn element(&self, py: Python<'_>, i: usize) -> PyRequestOutput {
        let row = &self.rows()[i];
        PyRequestOutput {
            request_id: self.request_id(py, i).to_owned().unbind(),
            new_token_ids: Tokens::new(self.delivered(i)),
            status: row.status,
            stop_reason: row.stop_reason,
        }
    }

    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for i in 0..self.len() {
            list.append(Py::new(py, self.element(py, i))?)?;
        }
        Ok(list)
    }
}

#[pymethods]
impl PyRequestOutputs {
    fn __len__(&self) -> usize {
        self.len()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if index.is_instance_of::<pyo3::types::PySlice>() {
            return self.to_list(py)?.as_any().get_item(index);
        }
        // As a list: an index past the machine's is out of range, not an overflow.
        let i: isize = index.extract().map_err(|error: PyErr| {
            if error.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                pyo3::exceptions::PyIndexError::new_err("cannot fit 'int' into an index-sized integer")
            } else {
                error
            }
        })?;
        let len = self.len() as isize;
        let j = if i < 0 { i + len } else { i };
        if !(0..len).contains(&j) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("index {i} out of range for {len} outputs")));
        }
        Ok(Py::new(py, self.element(py, j as usize))?.into_bound(py).into_any())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_list(py)?.as_any().try_iter().map(|it| it.into_any())
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mine = self.to_list(py)?;
        if let Ok(theirs) = other.cast::<PyRequestOutputs>() {
            return mine.eq(theirs.get().to_list(py)?);
        }
        if other.is_instance_of::<PyList>() || other.is_instance_of::<PyTuple>() {
            return mine.eq(pyo3::types::PyList::new(py, other.try_iter()?.collect::<PyResult<Vec<_>>>()?)?);
        }
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("RequestOutputs({})", self.to_list(py)?.repr()?))
    }

    /// Request ids, in output order.
    #[getter]
    fn req_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, (0..self.len()).map(|i| self.request_id(py, i)))
    }

    /// Every delivered token, flat, split by ``num_new_tokens`` (int32, read-only; a copy).
    #[getter]
    fn new_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let delivered: Vec<i32> = (0..self.len()).flat_map(|i| self.delivered(i).iter().copied()).collect();
        frozen(py, delivered)
    }

    /// Tokens delivered per request (int32, read-only; a copy).
    #[getter]
    fn num_new_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        frozen(py, self.rows().iter().map(|row| row.len as i32).collect())
    }

    /// ``RequestStatus`` values per request (int32, read-only; a copy).
    #[getter]
    fn statuses<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        frozen(py, self.rows().iter().map(|row| row.status as i32).collect())
    }

    /// Each request's prefix-cached blocks after this output, counted before a finish
    /// freed them (int32, read-only; a copy).
    #[getter]
    fn num_cached_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        frozen(py, self.rows().iter().map(|row| row.num_cached_blocks).collect())
    }

    /// Ids of the requests that finished in this step.
    #[getter]
    fn finished_req_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            (0..self.len()).filter(|&i| self.rows()[i].status.is_finished()).map(|i| self.request_id(py, i)),
        )
    }
}

/// A snapshot of one request: a live one (``Scheduler.get_request``) or a finished one
/// (``Scheduler.take_finished_requests``).
#[pyclass(frozen, module = "llmsched", name = "Request")]
pub struct PyRequest {
    /// The request's id.
    #[pyo3(get)]
    request_id: String,
    status: RequestStatus,
    /// ``C``: tokens whose KV is computed or scheduled to be.
    #[pyo3(get)]
    num_computed_tokens: i64,
    /// ``N``: prompt and output tokens so far.
    #[pyo3(get)]
    num_tokens: i64,
    /// Tokens in the prompt.
    #[pyo3(get)]
    num_prompt_tokens: i64,
    /// ``N`` plus the drafts waiting to be scheduled.
    #[pyo3(get)]
    num_tokens_with_spec: i64,
    /// The prompt.
    #[pyo3(get)]
    prompt_token_ids: Vec<i32>,
    /// The output tokens so far.
    #[pyo3(get)]
    output_token_ids: Vec<i32>,
    /// Drafts to schedule next (-1 placeholders under async scheduling).
    #[pyo3(get)]
    spec_token_ids: Vec<i32>,
    /// Output positions scheduled whose tokens have not returned yet (async).
    #[pyo3(get)]
    num_output_placeholders: i64,
    /// Tokens scheduled whose output has not been applied yet.
    #[pyo3(get)]
    num_in_flight_tokens: i64,
    /// In-flight tokens scheduled before the request's last preemption.
    #[pyo3(get)]
    num_stale_output_tokens: i64,
    /// Whether that stale output is dropped rather than delivered.
    #[pyo3(get)]
    drop_stale_output: bool,
    /// How often the request has been preempted.
    #[pyo3(get)]
    num_preemptions: u32,
    /// The most output tokens the request may produce.
    #[pyo3(get)]
    max_tokens: i64,
    /// Its priority under the priority policy (lower runs first).
    #[pyo3(get)]
    priority: i32,
    /// When the request arrived (seconds; the caller's clock or the epoch).
    #[pyo3(get)]
    arrival_time: f64,
    /// Whether the last scheduled chunk ended before the request's known tokens.
    #[pyo3(get)]
    is_prefill_chunk: bool,
    /// The request's KV block table (group 0's, with several KV-cache groups).
    #[pyo3(get)]
    block_ids: Vec<u32>,
    /// The request's KV block table in every KV-cache group, in the groups' order
    /// (``block_ids`` first; the null block 0 where a sliding window let blocks go).
    #[pyo3(get)]
    group_block_ids: Vec<Vec<u32>>,
    /// One 128-bit hash per full block of the request's tokens (empty without
    /// prefix caching).
    #[pyo3(get)]
    block_hashes: Vec<u128>,
    /// Leading blocks of ``block_ids`` registered in the prefix cache.
    #[pyo3(get)]
    num_cached_blocks: usize,
    /// The LoRA adapter the request runs under, or None.
    #[pyo3(get)]
    lora_id: Option<u32>,
    /// Whether it is a streaming-input session (``add_request(..., resumable=True)``).
    #[pyo3(get)]
    resumable: bool,
    /// A session's inputs added but not taken up yet (the end of the session counts as one).
    #[pyo3(get)]
    num_queued_inputs: usize,
    /// A session's inputs taken up after its first.
    #[pyo3(get)]
    num_inputs_taken: u32,
    /// The first step that may decode it again (vLLM's field of that name): recorded at
    /// each decode under a decode cadence (``Scheduler.set_decode_stagger``) and by a
    /// diffusion read's deferral, 0 before.
    #[pyo3(get)]
    next_decode_eligible_step: u64,
    /// With ``defer_block_free``, the last step with tokens that scheduled it (vLLM's
    /// ``last_sched_seq``; see ``Scheduler.step_seqs``); 0 without.
    #[pyo3(get)]
    last_sched_seq: u64,
    /// Its multimodal inputs (by index, ascending) whose encoder outputs it references in
    /// the encoder cache now.
    #[pyo3(get)]
    referenced_mm_inputs: Vec<u32>,
}

impl PyRequest {
    pub fn snapshot(r: &Request) -> Self {
        Self {
            request_id: r.id().to_string(),
            status: r.status(),
            num_computed_tokens: r.num_computed_tokens(),
            num_tokens: r.num_tokens(),
            num_prompt_tokens: r.num_prompt_tokens(),
            num_tokens_with_spec: r.num_tokens_with_spec(),
            prompt_token_ids: r.prompt_token_ids().to_vec(),
            output_token_ids: r.output_token_ids().collect(),
            spec_token_ids: r.spec_token_ids().to_vec(),
            num_output_placeholders: r.num_output_placeholders(),
            num_in_flight_tokens: r.num_in_flight_tokens(),
            num_stale_output_tokens: r.num_stale_output_tokens(),
            drop_stale_output: r.drop_stale_output(),
            num_preemptions: r.num_preemptions(),
            max_tokens: r.max_tokens(),
            priority: r.priority(),
            arrival_time: r.arrival_time(),
            is_prefill_chunk: r.is_prefill_chunk(),
            block_ids: r.block_ids().to_vec(),
            group_block_ids: (0..r.num_block_tables()).map(|g| r.group_block_ids(g).to_vec()).collect(),
            block_hashes: r.block_hashes().to_vec(),
            num_cached_blocks: r.num_cached_blocks(),
            lora_id: r.lora_id(),
            resumable: r.is_resumable(),
            num_queued_inputs: r.num_queued_inputs(),
            num_inputs_taken: r.num_inputs_taken(),
            next_decode_eligible_step: r.next_decode_eligible_step(),
            last_sched_seq: r.last_sched_seq(),
            referenced_mm_inputs: r.referenced_mm_inputs().to_vec(),
        }
    }
}

#[pymethods]
impl PyRequest {
    /// The request's status when the snapshot was taken.
    #[getter]
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        status_object(py, self.status)
    }

    fn __repr__(&self) -> String {
        format!(
            "Request(request_id={:?}, status={:?}, num_computed_tokens={}, num_tokens={})",
            self.request_id, self.status, self.num_computed_tokens, self.num_tokens
        )
    }
}
