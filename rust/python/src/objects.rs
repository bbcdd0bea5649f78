//! New Python strings, ints and lists whose failed allocation is a `MemoryError`: PyO3's
//! `PyString::new`, `PyList::new` and int conversions panic on one (a panic that would
//! reach Python as `PanicException`, or break the scheduler inside a call).

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyString};

/// A new str holding `text`.
pub fn new_str<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyString>> {
    // SAFETY: the GIL is held; `text` is valid UTF-8 of `text.len()` bytes (a slice holds at
    // most isize::MAX bytes). The call returns a new reference or NULL with an exception set.
    unsafe {
        let ptr = ffi::PyUnicode_FromStringAndSize(text.as_ptr().cast(), text.len() as ffi::Py_ssize_t);
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

/// A new list of `items`, in order.
pub fn new_list<'py, T>(py: Python<'py>, items: Vec<Bound<'py, T>>) -> PyResult<Bound<'py, PyList>> {
    // SAFETY: the GIL is held. `PyList_New` returns a new reference to a list of `len` empty
    // slots (or NULL with an exception set); `PyList_SetItem` fills slot `i < len` with the
    // reference it is given (stolen: `into_ptr` hands one over), and cannot fail then.
    unsafe {
        let list = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(items.len() as ffi::Py_ssize_t))?;
        for (i, item) in items.into_iter().enumerate() {
            ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(list.cast_into_unchecked())
    }
}

/// A new list of new strs holding `texts`, in order.
pub fn new_str_list<'py>(py: Python<'py>, texts: &[impl AsRef<str>]) -> PyResult<Bound<'py, PyList>> {
    new_list(py, texts.iter().map(|text| new_str(py, text.as_ref())).collect::<PyResult<_>>()?)
}

/// A new int holding `value`.
pub fn new_int(py: Python<'_>, value: u32) -> PyResult<Bound<'_, PyInt>> {
    // SAFETY: the GIL is held; the call returns a new reference or NULL with an exception set.
    unsafe { Ok(Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromUnsignedLong(value.into()))?.cast_into_unchecked()) }
}
