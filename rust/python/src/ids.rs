//! The request-id objects a step hands out, made by copies in C rather than one
//! lookup and reference-count call per id.
//!
//! A step hands out its ids twice: the `req_ids` list (its holder may change it) and
//! the `StepIds` the update matches runner rows against and the outputs name their
//! requests by. Both are copies of the `IdBatch`, the previous step's ids kept as a
//! Python list and edited into this step's: a step's requests are mostly the previous
//! step's, in the same order (the running queue's), so the edit cuts out the requests
//! that left and appends the ones admitted.

use std::ptr::NonNull;

use llmsched_core::Handle;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

/// An id object borrowed from the list or tuple that holds a reference on it.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct IdRef(NonNull<ffi::PyObject>);

// SAFETY: an `IdRef` is an address; the object is only read through it with the GIL held
// (`StepIds::get`, which takes a `Python` token), while its owner keeps it alive.
unsafe impl Send for IdRef {}
// SAFETY: as above.
unsafe impl Sync for IdRef {}

/// A step's ids in step order, one reference each (owned by a tuple nobody else sees),
/// and the same objects as addresses, read without a C call.
pub struct StepIds {
    /// Read only by dropping it, which releases the ids.
    _owner: Py<PyTuple>,
    ids: Box<[IdRef]>,
}

impl StepIds {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The id at step position `i`.
    pub fn get<'a, 'py>(&'a self, py: Python<'py>, i: usize) -> Borrowed<'a, 'py, PyString> {
        // SAFETY: `_owner` holds a reference on every id for as long as `self` lives, and
        // every id is a str (each came to the batch as a `Bound<PyString>`).
        unsafe { Borrowed::from_ptr(py, self.ids[i].0.as_ptr()).cast_unchecked::<PyString>() }
    }

    /// The ids' addresses, in step order (to compare objects by identity).
    pub fn addresses(&self) -> impl ExactSizeIterator<Item = *mut ffi::PyObject> + '_ {
        self.ids.iter().map(|id| id.0.as_ptr())
    }
}

/// How many positions an in-place edit may shift, per id of the batch, before a rebuild
/// costs less. A cut moves every id after it down by one `memmove`, a fraction of an
/// instruction per id; a rebuild takes tens per id.
const SHIFTS_PER_ID: usize = 16;

/// The last step's ids, kept for the next step (see the module documentation).
#[derive(Default)]
pub struct IdBatch {
    handles: Vec<Handle>,
    /// `handles`' ids, borrowed from `list`, which holds one reference on each.
    ids: Vec<IdRef>,
    list: Option<Py<PyList>>,
    /// Runs of the batch to cut, `(start, end)` in batch positions; kept to reuse its memory.
    cuts: Vec<(usize, usize)>,
}

impl IdBatch {
    /// Makes the batch the ids of `handles`, in order. `id_of` gives a handle's id and
    /// `prefetch` starts loading it, for the handles not already in the batch. On error the
    /// batch is left empty, never half-edited.
    pub fn sync<'py>(
        &mut self,
        py: Python<'py>,
        handles: &[Handle],
        id_of: impl Fn(Handle) -> PyResult<Bound<'py, PyString>>,
        prefetch: impl Fn(Handle),
    ) -> PyResult<()> {
        let result = self.edit(py, handles, &id_of, &prefetch);
        if result.is_err() {
            *self = Self::default();
        }
        debug_assert!(result.is_err() || self.handles == handles);
        result
    }

    fn edit<'py>(
        &mut self,
        py: Python<'py>,
        handles: &[Handle],
        id_of: &impl Fn(Handle) -> PyResult<Bound<'py, PyString>>,
        prefetch: &impl Fn(Handle),
    ) -> PyResult<()> {
        let Some(list) = self.list.as_ref().map(|list| list.bind(py).clone()) else {
            return self.rebuild(py, handles, id_of, prefetch);
        };
        // Keep the longest run of the batch that `handles` starts with, in order, matching
        // greedily: every batch entry that is not the next handle wanted is cut. Runs that
        // match (most of a step) are compared a block at a time.
        self.cuts.clear();
        let (mut kept, mut wanted, mut shifts) = (0, 0, 0);
        let old = &self.handles;
        loop {
            let same = common_prefix(&old[kept..], &handles[wanted..]);
            kept += same;
            wanted += same;
            if kept == old.len() || wanted == handles.len() {
                break;
            }
            let start = kept;
            while kept < old.len() && old[kept] != handles[wanted] {
                kept += 1;
            }
            self.cuts.push((start, kept));
            shifts += old.len() - kept;
        }
        if kept < old.len() {
            self.cuts.push((kept, old.len()));
        }
        if shifts > SHIFTS_PER_ID * handles.len().max(1) {
            return self.rebuild(py, handles, id_of, prefetch);
        }
        // From the last cut back, so each cut's positions are still the batch's.
        for &(start, end) in self.cuts.iter().rev() {
            // SAFETY: the GIL is held, `list` is alive and `start <= end <= len(list)`:
            // the list and `handles` are edited in step. Deleting a slice releases the
            // list's references on the ids cut.
            let status = unsafe {
                ffi::PyList_SetSlice(
                    list.as_ptr(),
                    start as ffi::Py_ssize_t,
                    end as ffi::Py_ssize_t,
                    std::ptr::null_mut(),
                )
            };
            if status != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        if !self.cuts.is_empty() {
            self.compact();
        }
        for item in ids_ahead_loaded(&handles[wanted..], id_of, prefetch) {
            let (handle, id) = item?;
            list.append(&id)?;
            self.ids.push(IdRef::of(&id));
            self.handles.push(handle);
        }
        Ok(())
    }

    /// Removes the cut runs from `handles` and `ids` (the list's are gone already).
    fn compact(&mut self) {
        let mut write = self.cuts[0].0;
        for (i, &(_, end)) in self.cuts.iter().enumerate() {
            let next = self.cuts.get(i + 1).map_or(self.handles.len(), |&(start, _)| start);
            self.handles.copy_within(end..next, write);
            self.ids.copy_within(end..next, write);
            write += next - end;
        }
        self.handles.truncate(write);
        self.ids.truncate(write);
    }

    /// Makes the batch anew: one id lookup per handle.
    fn rebuild<'py>(
        &mut self,
        py: Python<'py>,
        handles: &[Handle],
        id_of: &impl Fn(Handle) -> PyResult<Bound<'py, PyString>>,
        prefetch: &impl Fn(Handle),
    ) -> PyResult<()> {
        *self = Self { cuts: std::mem::take(&mut self.cuts), ..Self::default() };
        // A slice never holds more than isize::MAX bytes, so its length fits in Py_ssize_t.
        let len = handles.len() as ffi::Py_ssize_t;
        // SAFETY: the GIL is held. `PyList_New` returns a new reference (or NULL with an
        // exception set) to a list of `len` empty slots; `PyList_SetItem` fills slot `i < len`
        // with the reference it is given (stolen: `into_ptr` hands one over). On an early
        // return the list is dropped with some slots empty, which a list's deallocation skips.
        let list = unsafe {
            let list = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len))?;
            for (i, item) in ids_ahead_loaded(handles, id_of, prefetch).enumerate() {
                let (_, id) = item?;
                self.ids.push(IdRef::of(&id));
                ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, id.into_ptr());
            }
            list.cast_into_unchecked::<PyList>()
        };
        self.handles.extend_from_slice(handles);
        self.list = Some(list.unbind());
        Ok(())
    }

    /// The batch as a new `req_ids` list and a new `StepIds`: copies made in C.
    pub fn step_ids(&self, py: Python<'_>) -> PyResult<(StepIds, Py<PyList>)> {
        let Some(list) = &self.list else {
            let owner = PyTuple::empty(py).unbind();
            let req_ids = crate::objects::new_list::<PyString>(py, Vec::new())?.unbind();
            return Ok((StepIds { _owner: owner, ids: Box::default() }, req_ids));
        };
        let len = self.ids.len() as ffi::Py_ssize_t;
        // SAFETY: the GIL is held and `list` is alive; both calls return a new reference
        // (or NULL with an exception set) to a copy holding a reference on each id.
        let (req_ids, owner) = unsafe {
            (
                Bound::from_owned_ptr_or_err(py, ffi::PyList_GetSlice(list.as_ptr(), 0, len))?
                    .cast_into_unchecked::<PyList>(),
                Bound::from_owned_ptr_or_err(py, ffi::PyList_AsTuple(list.as_ptr()))?.cast_into_unchecked::<PyTuple>(),
            )
        };
        // The tuple holds the very objects the batch does, in the same order.
        Ok((StepIds { _owner: owner.unbind(), ids: self.ids.as_slice().into() }, req_ids.unbind()))
    }
}

/// Each handle with its id, in order, the id `prefetch::DISTANCE` handles ahead already
/// loading: after a model step the id objects have left the CPU caches, and a list's
/// reference to each writes into it.
fn ids_ahead_loaded<'a, 'py>(
    handles: &'a [Handle],
    id_of: &'a impl Fn(Handle) -> PyResult<Bound<'py, PyString>>,
    prefetch: &'a impl Fn(Handle),
) -> impl Iterator<Item = PyResult<(Handle, Bound<'py, PyString>)>> + 'a {
    handles.iter().enumerate().map(move |(i, &handle)| {
        if let Some(&ahead) = handles.get(i + llmsched_core::prefetch::DISTANCE) {
            prefetch(ahead);
        }
        id_of(handle).map(|id| (handle, id))
    })
}

/// How many handles `a` and `b` start with alike.
fn common_prefix(a: &[Handle], b: &[Handle]) -> usize {
    // Whole blocks first, each compared without an early exit (the compiler vectorizes it).
    const BLOCK: usize = 16;
    let mut same = 0;
    for (x, y) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        if !x.iter().zip(y).fold(true, |alike, (p, q)| alike & (p == q)) {
            break;
        }
        same += BLOCK;
    }
    same + a[same..].iter().zip(&b[same..]).take_while(|(p, q)| p == q).count()
}

impl IdRef {
    fn of(id: &Bound<'_, PyString>) -> Self {
        // SAFETY: a live object's address is never null.
        Self(unsafe { NonNull::new_unchecked(id.as_ptr()) })
    }
}
