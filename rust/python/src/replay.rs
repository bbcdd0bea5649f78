//! `Replay`: the core's virtual-time replay of a workload (`llmsched simulate`), bound.
//! Converts the workload's columns in, runs the replay with the GIL released (over memory
//! the core owns), and moves the results out as numpy arrays.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use llmsched_core::replay::cost::{StepColumns, StepCost, StepShape};
use llmsched_core::replay::tokens::prompt_tokens;
use llmsched_core::replay::{Replay, ReplayOptions, ReplayRequest};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyList};

use crate::config::PySchedulerConfig;
use crate::errors::{config_error, core_err, internal_error, panic_reason, request_error};
use crate::scheduler::stats_dict;

struct Inner {
    replay: Replay,
    /// Set when the replay failed (an error or a panic): it cannot go on.
    broken: Option<String>,
}

/// A workload replayed in virtual time through the scheduler, a runner without a model
/// and a step-cost model: the engine loop behind ``llmsched simulate`` (``llmsched.sim``
/// builds it; see ``llmsched.sim.simulate``). The requests are columns in arrival order:
/// ids, arrival times (virtual seconds), prompt and output lengths, the keys seeding
/// their prompts, and their Mooncake prefix blocks (``num_prefix_blocks`` per request,
/// flat in ``prefix_blocks``). ``cost`` maps every name of ``COST_TERMS`` to its
/// milliseconds. The engine is taken as warmed up with a one-request step of every token
/// count up to ``warm_up_tokens``: a step of another batch shape costs ``new_shape_ms``
/// the first time.
#[pyclass(frozen, module = "llmsched._core", name = "Replay")]
pub struct PyReplay {
    inner: Mutex<Inner>,
}

fn terms(py: Python<'_>, cost: &Bound<'_, PyAny>) -> PyResult<StepCost> {
    let mut terms = [0.0; StepCost::TERMS.len()];
    for (term, name) in terms.iter_mut().zip(StepCost::TERMS) {
        let value = cost.get_item(name).map_err(|e| {
            if e.is_instance_of::<PyKeyError>(py) {
                request_error(py, format!("cost: the term {name} is missing"))
            } else {
                request_error(py, format!("cost: must map each term to its milliseconds, got {}", cost.get_type()))
            }
        })?;
        *term = value.extract().map_err(|_| request_error(py, format!("cost: {name}={value}: not a number")))?;
    }
    Ok(StepCost { terms })
}

fn column<T>(py: Python<'_>, name: &str, values: Vec<T>, len: usize) -> PyResult<Vec<T>> {
    if values.len() != len {
        return Err(request_error(py, format!("{name}: {} values for {len} requests", values.len())));
    }
    Ok(values)
}

/// A panic caught in the core: the replay cannot go on, and Python gets `InternalError`.
fn panicked(py: Python<'_>, broken: &mut Option<String>, payload: &(dyn std::any::Any + Send)) -> PyErr {
    let reason = panic_reason(payload);
    *broken = Some(reason.clone());
    internal_error(py, format!("internal error in llmsched (please report it): {reason}"))
}

impl PyReplay {
    /// Reads the replay (also after an error stopped it: what it did until then).
    fn with_inner<R>(&self, py: Python<'_>, f: impl FnOnce(&Replay) -> PyResult<R>) -> PyResult<R> {
        let mut guard =
            self.inner.lock_py_attached(py).map_err(|_| internal_error(py, "the replay's lock is poisoned".into()))?;
        match catch_unwind(AssertUnwindSafe(|| f(&guard.replay))) {
            Ok(result) => result,
            Err(payload) => Err(panicked(py, &mut guard.broken, payload.as_ref())),
        }
    }
}

#[pymethods]
impl PyReplay {
    #[new]
    #[pyo3(signature = (
        config, cost, request_ids, arrival_times, prompt_lens, output_lens, keys,
        num_prefix_blocks, prefix_blocks, *, seed=0, vocab_size=32000, acceptance_rate=0.7,
        check_invariants=false, warm_up_tokens=0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: Bound<'_, PyAny>,
        cost: Bound<'_, PyAny>,
        request_ids: Vec<String>,
        arrival_times: Vec<f64>,
        prompt_lens: Vec<usize>,
        output_lens: Vec<i64>,
        keys: Vec<u64>,
        num_prefix_blocks: Vec<usize>,
        prefix_blocks: Vec<u64>,
        seed: u64,
        vocab_size: u32,
        acceptance_rate: f64,
        check_invariants: bool,
        warm_up_tokens: i64,
    ) -> PyResult<Self> {
        let config = config.cast_into::<PySchedulerConfig>().map_err(|e| {
            config_error(py, format!("config: must be a SchedulerConfig, got {}", e.into_inner().get_type()))
        })?;
        let cost = terms(py, &cost)?;
        let n = request_ids.len();
        let arrival_times = column(py, "arrival_times", arrival_times, n)?;
        let prompt_lens = column(py, "prompt_lens", prompt_lens, n)?;
        let output_lens = column(py, "output_lens", output_lens, n)?;
        let keys = column(py, "keys", keys, n)?;
        let num_prefix_blocks = column(py, "num_prefix_blocks", num_prefix_blocks, n)?;
        let counted = num_prefix_blocks.iter().try_fold(0usize, |sum, &n| sum.checked_add(n));
        if counted != Some(prefix_blocks.len()) {
            let counted = counted.map_or("more than memory holds".into(), |n| n.to_string());
            return Err(request_error(
                py,
                format!("prefix_blocks: {} block ids, but num_prefix_blocks counts {counted}", prefix_blocks.len()),
            ));
        }
        let mut blocks = prefix_blocks.into_iter();
        let requests = request_ids
            .into_iter()
            .enumerate()
            .map(|(i, request_id)| ReplayRequest {
                request_id,
                arrival_time: arrival_times[i],
                prompt_len: prompt_lens[i],
                output_len: output_lens[i],
                key: keys[i],
                prefix_blocks: blocks.by_ref().take(num_prefix_blocks[i]).collect(),
            })
            .collect();
        let options = ReplayOptions { seed, vocab_size, acceptance_rate, check_invariants, warm_up_tokens };
        let replay = Replay::new(config.get().inner.clone(), cost, requests, options).map_err(core_err)?;
        Ok(Self { inner: Mutex::new(Inner { replay, broken: None }) })
    }

    /// Replays for about ``seconds`` of wall time (at least one engine step), or to the
    /// end, with the GIL released; returns whether the replay is done. After an error the
    /// replay cannot go on (every later ``run`` raises ``InternalError``); what it did
    /// until then can still be read.
    fn run(&self, py: Python<'_>, seconds: f64) -> PyResult<bool> {
        let wall = Duration::try_from_secs_f64(seconds).map_err(|_| {
            request_error(py, format!("seconds: must be a number >= 0 that a duration can hold, got {seconds}"))
        })?;
        let mut guard =
            self.inner.lock_py_attached(py).map_err(|_| internal_error(py, "the replay's lock is poisoned".into()))?;
        if let Some(reason) = &guard.broken {
            return Err(internal_error(py, format!("the replay cannot go on after an error: {reason}")));
        }
        let replay = &mut guard.replay;
        let result = py.detach(|| catch_unwind(AssertUnwindSafe(|| replay.run_for(wall))));
        match result {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(error)) => {
                guard.broken = Some(error.to_string());
                Err(core_err(error))
            }
            Err(payload) => Err(panicked(py, &mut guard.broken, payload.as_ref())),
        }
    }

    /// Whether every request has arrived and finished, and no step is in flight.
    #[getter]
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_inner(py, |r| Ok(r.is_done()))
    }

    /// The virtual clock, in seconds.
    #[getter]
    fn clock(&self, py: Python<'_>) -> PyResult<f64> {
        self.with_inner(py, |r| Ok(r.clock()))
    }

    /// Requests that have arrived: the workload's first ones.
    #[getter]
    fn num_arrived(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |r| Ok(r.num_arrived()))
    }

    /// Requests finished.
    #[getter]
    fn num_finished(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_inner(py, |r| Ok(r.num_finished()))
    }

    /// Steps scheduled, empty ones included.
    #[getter]
    fn num_steps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_inner(py, |r| Ok(r.num_steps()))
    }

    /// Wall seconds spent in the scheduler's ``schedule`` and ``update_from_output``.
    #[getter]
    fn scheduler_seconds(&self, py: Python<'_>) -> PyResult<f64> {
        self.with_inner(py, |r| Ok(r.scheduler_time().as_secs_f64()))
    }

    /// The scheduler's counters, as ``Scheduler.stats()`` gives them.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (stats, prefix) =
            self.with_inner(py, |r| Ok((r.scheduler().stats().clone(), r.scheduler().prefix_cache_stats().clone())))?;
        stats_dict(py, &stats, &prefix)
    }

    /// Each request's times so far, in the workload's order, as new arrays (a copy):
    /// ``scheduled``, ``first_token`` and ``finished`` (virtual seconds, NaN for what has
    /// not happened), ``num_output``, ``preemptions`` (int64), and ``finish_reason`` (a
    /// list: vLLM's finish reason, or None while unfinished).
    fn times<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let times = self.with_inner(py, |r| Ok(r.times().to_vec()))?;
        let dict = PyDict::new(py);
        let floats = |f: fn(&llmsched_core::replay::RequestTimes) -> f64| times.iter().map(f).collect::<Vec<f64>>();
        dict.set_item("scheduled", floats(|t| t.scheduled).into_pyarray(py))?;
        dict.set_item("first_token", floats(|t| t.first_token).into_pyarray(py))?;
        dict.set_item("finished", floats(|t| t.finished).into_pyarray(py))?;
        dict.set_item("num_output", times.iter().map(|t| t.num_output).collect::<Vec<i64>>().into_pyarray(py))?;
        dict.set_item("preemptions", times.iter().map(|t| t.preemptions).collect::<Vec<i64>>().into_pyarray(py))?;
        let reasons = times.iter().map(|t| t.status.and_then(|s| s.finish_reason()));
        dict.set_item("finish_reason", PyList::new(py, reasons)?)?;
        Ok(dict)
    }

    /// The scheduler's state at each step as it started (empty steps included), as new
    /// arrays (a copy): ``time`` (virtual seconds), ``kv_usage`` (a fraction of the pool),
    /// ``running`` and ``waiting`` (requests).
    fn timeline<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let timeline = self.with_inner(py, |r| Ok(r.timeline().clone()))?;
        let dict = PyDict::new(py);
        dict.set_item("time", timeline.time.into_pyarray(py))?;
        dict.set_item("kv_usage", timeline.kv_usage.into_pyarray(py))?;
        dict.set_item("running", timeline.running.into_pyarray(py))?;
        dict.set_item("waiting", timeline.waiting.into_pyarray(py))?;
        Ok(dict)
    }
}

/// The tokens of a workload request's prompt (``RequestSpec.prompt_token_ids``): its own
/// ``key``'s, or its Mooncake ``prefix_blocks``' and then its own; a new int32 array.
#[pyfunction]
#[pyo3(signature = (key, prompt_len, prefix_blocks, vocab_size))]
pub fn prompt_token_ids(
    py: Python<'_>,
    key: u64,
    prompt_len: usize,
    prefix_blocks: Vec<u64>,
    vocab_size: u32,
) -> PyResult<Bound<'_, PyArray1<i32>>> {
    if !(2..=i32::MAX as u32).contains(&vocab_size) {
        return Err(request_error(py, format!("vocab_size: must be in [2, 2**31 - 1], got {vocab_size}")));
    }
    let tokens = prompt_tokens(key, prompt_len, &prefix_blocks, vocab_size).map_err(core_err)?;
    Ok(tokens.into_iter().map(|t| t as i32).collect::<Vec<i32>>().into_pyarray(py))
}

/// The shape of a step (``llmsched.steps.StepShape``'s fields, by name): what it asks of
/// the model, read from its columns (one entry per scheduled request: ``int32`` arrays),
/// the requests it sets up (new or resumed) and lets go (finished), and the KV blocks in
/// use as it runs. The same reading as the replay's (``Replay``); nothing is copied.
#[pyfunction]
#[pyo3(signature = (
    num_scheduled_tokens, num_computed_tokens, num_spec_tokens, num_output_tokens,
    new_requests, finished_requests, kv_blocks,
))]
#[allow(clippy::too_many_arguments)]
pub fn step_shape<'py>(
    py: Python<'py>,
    num_scheduled_tokens: PyReadonlyArray1<'py, i32>,
    num_computed_tokens: PyReadonlyArray1<'py, i32>,
    num_spec_tokens: PyReadonlyArray1<'py, i32>,
    num_output_tokens: PyReadonlyArray1<'py, i32>,
    new_requests: usize,
    finished_requests: usize,
    kv_blocks: usize,
) -> PyResult<Bound<'py, PyDict>> {
    fn slice<'a>(py: Python<'_>, name: &str, array: &'a PyReadonlyArray1<'_, i32>) -> PyResult<&'a [i32]> {
        array.as_slice().map_err(|_| request_error(py, format!("{name}: must be a contiguous int32 array")))
    }
    let columns = StepColumns {
        num_scheduled_tokens: slice(py, "num_scheduled_tokens", &num_scheduled_tokens)?,
        num_computed_tokens: slice(py, "num_computed_tokens", &num_computed_tokens)?,
        num_spec_tokens: slice(py, "num_spec_tokens", &num_spec_tokens)?,
        num_output_tokens: slice(py, "num_output_tokens", &num_output_tokens)?,
    };
    let shape = StepShape::from_columns(columns, new_requests, finished_requests, kv_blocks)
        .ok_or_else(|| request_error(py, "the step's columns differ in length".into()))?;
    let dict = PyDict::new(py);
    for (name, count) in shape.named() {
        dict.set_item(name, count)?;
    }
    Ok(dict)
}
