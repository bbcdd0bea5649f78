//! The objects a step hands to Python: `SchedulerOutput`, `RequestOutput`,
//! and the `Request` snapshot of `get_request`.

use llmsched_core::{Request, RequestStatus};
use numpy::{PyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyTuple};

/// `llmsched.status.RequestStatus` members, indexed by value - 1.
static STATUS_MEMBERS: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();

pub fn status_object(py: Python<'_>, status: RequestStatus) -> PyResult<Bound<'_, PyAny>> {
    let members = STATUS_MEMBERS.get_or_try_init(py, || -> PyResult<Py<PyTuple>> {
        let enum_class = py.import("llmsched.status")?.getattr("RequestStatus")?;
        let members: Vec<Bound<'_, PyAny>> = enum_class.try_iter()?.collect::<PyResult<_>>()?;
        Ok(PyTuple::new(py, members)?.unbind())
    })?;
    members.bind(py).get_item(status as usize - 1)
}

/// A read-only int32 array that owns `values` (moved, not copied).
pub fn frozen_array(py: Python<'_>, values: Vec<i32>) -> Py<PyArray1<i32>> {
    use numpy::IntoPyArray;
    let array = values.into_pyarray(py);
    // SAFETY: the array was created just now and nothing else refers to it yet.
    unsafe {
        (*array.as_array_ptr()).flags &= !numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
    }
    array.unbind()
}

/// What one ``schedule()`` step decided. Immutable.
///
/// Every array is int32, built in Rust and moved into numpy without a copy;
/// arrays are read-only. Per-request arrays are aligned with ``req_ids``:
/// running requests first (in running order), then this step's admissions.
#[pyclass(frozen, module = "llmsched", name = "SchedulerOutput")]
pub struct PySchedulerOutput {
    pub scheduler_uid: u64,
    #[pyo3(get)]
    pub step_id: u64,
    #[pyo3(get)]
    pub req_ids: Py<PyList>,
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
    /// Block ids per request in ``block_ids``: the whole table for new and
    /// resumed requests (replace), the newly allocated blocks otherwise (append).
    #[pyo3(get)]
    pub num_block_ids: Py<PyArray1<i32>>,
    #[pyo3(get)]
    pub block_ids: Py<PyArray1<i32>>,
    /// For new and resumed requests, how many tokens they hold (prompt and
    /// outputs so far); 0 for the others.
    #[pyo3(get)]
    pub num_all_token_ids: Py<PyArray1<i32>>,
    /// The tokens counted by ``num_all_token_ids``, flat.
    #[pyo3(get)]
    pub all_token_ids: Py<PyArray1<i32>>,
    #[pyo3(get)]
    pub total_num_scheduled_tokens: i64,
    #[pyo3(get)]
    pub new_req_ids: Py<PyList>,
    #[pyo3(get)]
    pub resumed_req_ids: Py<PyList>,
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

/// What one step produced for one request.
#[pyclass(frozen, module = "llmsched", name = "RequestOutput")]
pub struct PyRequestOutput {
    #[pyo3(get)]
    pub request_id: Py<PyString>,
    pub new_token_ids: Box<[i32]>,
    pub status: RequestStatus,
    /// The stop token id that finished the request, if one did.
    #[pyo3(get)]
    pub stop_reason: Option<i32>,
}

pub fn finish_reason(status: RequestStatus) -> Option<&'static str> {
    match status {
        RequestStatus::FinishedStopped | RequestStatus::WaitingForStreamingReq => Some("stop"),
        RequestStatus::FinishedLengthCapped | RequestStatus::FinishedIgnored => Some("length"),
        RequestStatus::FinishedAborted => Some("abort"),
        RequestStatus::FinishedError => Some("error"),
        RequestStatus::FinishedRepetition => Some("repetition"),
        _ => None,
    }
}

#[pymethods]
impl PyRequestOutput {
    #[getter]
    fn new_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.new_token_ids.iter())
    }

    #[getter]
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        status_object(py, self.status)
    }

    #[getter]
    fn finished(&self) -> bool {
        self.status.is_finished()
    }

    /// vLLM's finish reason (``"stop"``, ``"length"``, ``"abort"``...), or None.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        if self.status.is_finished() {
            finish_reason(self.status)
        } else {
            None
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "RequestOutput(request_id={}, new_token_ids={:?}, status={:?})",
            self.request_id.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            self.new_token_ids,
            self.status
        )
    }
}

/// A snapshot of one live request, taken by ``Scheduler.get_request``.
#[pyclass(frozen, module = "llmsched", name = "Request")]
pub struct PyRequest {
    #[pyo3(get)]
    request_id: String,
    status: RequestStatus,
    #[pyo3(get)]
    num_computed_tokens: i64,
    #[pyo3(get)]
    num_tokens: i64,
    #[pyo3(get)]
    num_prompt_tokens: i64,
    #[pyo3(get)]
    num_tokens_with_spec: i64,
    #[pyo3(get)]
    prompt_token_ids: Vec<i32>,
    #[pyo3(get)]
    output_token_ids: Vec<i32>,
    #[pyo3(get)]
    spec_token_ids: Vec<i32>,
    #[pyo3(get)]
    num_output_placeholders: i64,
    #[pyo3(get)]
    num_in_flight_tokens: i64,
    #[pyo3(get)]
    num_preemptions: u32,
    #[pyo3(get)]
    max_tokens: i64,
    #[pyo3(get)]
    priority: i32,
    #[pyo3(get)]
    arrival_time: f64,
    #[pyo3(get)]
    is_prefill_chunk: bool,
    #[pyo3(get)]
    block_ids: Vec<u32>,
    #[pyo3(get)]
    block_hashes: Vec<u128>,
}

impl PyRequest {
    pub fn snapshot(r: &Request) -> Self {
        Self {
            request_id: r.id.to_string(),
            status: r.status(),
            num_computed_tokens: r.num_computed_tokens(),
            num_tokens: r.num_tokens(),
            num_prompt_tokens: r.num_prompt_tokens(),
            num_tokens_with_spec: r.num_tokens_with_spec(),
            prompt_token_ids: r.prompt_token_ids().to_vec(),
            output_token_ids: r.output_token_ids().to_vec(),
            spec_token_ids: r.spec_token_ids().to_vec(),
            num_output_placeholders: r.num_output_placeholders(),
            num_in_flight_tokens: r.num_in_flight_tokens(),
            num_preemptions: r.num_preemptions(),
            max_tokens: r.max_tokens(),
            priority: r.priority(),
            arrival_time: r.arrival_time(),
            is_prefill_chunk: r.is_prefill_chunk(),
            block_ids: r.block_ids().to_vec(),
            block_hashes: r.block_hashes().to_vec(),
        }
    }
}

#[pymethods]
impl PyRequest {
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
