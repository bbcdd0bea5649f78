//! Argument conversion with errors that name the field and the value.

use llmsched_core::ListLimit;
use numpy::{Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyMemoryError, PyOverflowError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

use crate::errors::core_err;

/// A field's name for an error message, built only when an error is reported (the
/// indexed names of a long token list would otherwise cost a `format!` per token).
pub trait Field {
    fn name(&self) -> String;
}

impl Field for &str {
    fn name(&self) -> String {
        self.to_string()
    }
}

/// Element `.1` of the field `.0`: `draft_token_ids[3]`, then `draft_token_ids[3][0]`.
pub struct Indexed<'a>(pub &'a dyn Field, pub usize);

impl Field for Indexed<'_> {
    fn name(&self) -> String {
        format!("{}[{}]", self.0.name(), self.1)
    }
}

/// `repr(value)`, or a placeholder when its `__repr__` fails.
pub fn describe(value: &Bound<'_, PyAny>) -> String {
    value.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into())
}

/// `value` as an i64; bools and non-integers are refused with `make_error`. The value is
/// read once: an `__index__` that fails is reported as it failed, whatever a second
/// call would return.
pub fn int_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    field: &dyn Field,
    make_error: fn(Python<'_>, String) -> PyErr,
) -> PyResult<i64> {
    if value.is_instance_of::<PyBool>() || value.is_instance_of::<PyFloat>() {
        return Err(make_error(py, format!("{}={}: must be an integer", field.name(), describe(value))));
    }
    // Python ints and numpy integers (anything with __index__).
    if value.is_instance_of::<PyInt>() || value.hasattr("__index__").unwrap_or(false) {
        return value.extract::<i64>().map_err(|error| {
            let reason = if error.is_instance_of::<PyOverflowError>(py) {
                "out of the 64-bit integer range".to_string()
            } else {
                format!("cannot be read as an integer ({error})")
            };
            make_error(py, format!("{}={}: {reason}", field.name(), describe(value)))
        });
    }
    Err(make_error(py, format!("{}={}: must be an integer, got {}", field.name(), describe(value), type_name(value))))
}

/// `numpy.bool_` (named `numpy.bool` since numpy 2), which is not a `bool` subclass.
fn is_numpy_bool(value: &Bound<'_, PyAny>) -> bool {
    let ty = value.get_type();
    let named = |attr: &str| ty.getattr(attr).ok().and_then(|v| v.extract::<String>().ok());
    named("__module__").as_deref() == Some("numpy") && matches!(named("__name__").as_deref(), Some("bool_" | "bool"))
}

pub fn bool_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    field: &dyn Field,
    make_error: fn(Python<'_>, String) -> PyErr,
) -> PyResult<bool> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    if is_numpy_bool(value) {
        return value.is_truthy();
    }
    Err(make_error(py, format!("{}={}: must be a bool, got {}", field.name(), describe(value), type_name(value))))
}

pub fn float_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    field: &dyn Field,
    make_error: fn(Python<'_>, String) -> PyErr,
) -> PyResult<f64> {
    if value.is_instance_of::<PyBool>() {
        return Err(make_error(py, format!("{}={}: must be a number", field.name(), describe(value))));
    }
    value.extract::<f64>().map_err(|_| {
        make_error(py, format!("{}={}: must be a number, got {}", field.name(), describe(value), type_name(value)))
    })
}

pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// The items of a 1-D array whose dtype numpy calls `T` (native byte order), read in
/// place by `read` when the array lays them out as a Rust slice (aligned, contiguous);
/// None otherwise.
fn with_slice<T: Element, R>(array: &Bound<'_, PyUntypedArray>, read: impl FnOnce(&[T]) -> R) -> Option<R> {
    let typed = array.cast::<PyArray1<T>>().ok()?;
    let guard = typed.try_readonly().ok()?;
    let slice = guard.as_slice().ok()?;
    Some(read(slice))
}

/// numpy's own copy of a 1-D array's items as `T`: a new C-contiguous, aligned array,
/// whatever the layout it came in (a field of a packed record, a strided or reversed
/// view, an offset buffer, another byte order or integer width). The values are cast as
/// numpy casts them: exact for every integer dtype that fits `T`.
fn numpy_copy<T: Element + Copy>(py: Python<'_>, array: &Bound<'_, PyUntypedArray>) -> PyResult<Vec<T>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "dtype"), numpy::dtype::<T>(py))?;
    kwargs.set_item(intern!(py, "order"), intern!(py, "C"))?;
    let copy = py.import(intern!(py, "numpy"))?.getattr(intern!(py, "array"))?.call((array,), Some(&kwargs))?;
    let copy = copy.cast_into::<PyArray1<T>>()?;
    let guard = copy.try_readonly()?;
    Ok(guard.as_slice()?.to_vec())
}

/// A 1-D int32 array's items, exactly the values it holds (any layout or byte order);
/// None if `value` is not a 1-D array of a 32-bit signed integer dtype.
pub fn int32_items(py: Python<'_>, value: &Bound<'_, PyAny>) -> Option<PyResult<Vec<i32>>> {
    let array = value.cast::<PyUntypedArray>().ok()?;
    let dtype = array.dtype();
    if array.ndim() != 1 || dtype.kind() != b'i' || dtype.itemsize() != 4 {
        return None;
    }
    Some(match with_slice(array, <[i32]>::to_vec) {
        Some(items) => Ok(items),
        None => numpy_copy::<i32>(py, array),
    })
}

/// The token ids a 1-D integer array holds, exactly (any layout, byte order or integer
/// width); refused if it is not 1-D or does not hold integers.
fn array_tokens(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    field: &dyn Field,
    make_error: fn(Python<'_>, String) -> PyErr,
) -> PyResult<Vec<i64>> {
    if array.ndim() != 1 {
        return Err(make_error(
            py,
            format!("{}: must be 1-D, got an array of shape {:?}", field.name(), array.shape()),
        ));
    }
    let dtype = array.dtype();
    let kind = dtype.kind();
    if kind != b'i' && kind != b'u' {
        return Err(make_error(py, format!("{}: must hold integers, got dtype {}", field.name(), dtype)));
    }
    // A contiguous int32 array (a runner's) converts in one loop the compiler vectorizes.
    if let Some(tokens) = with_slice(array, |slice: &[i32]| slice.iter().map(|&t| i64::from(t)).collect()) {
        return Ok(tokens);
    }
    if let Some(tokens) = with_slice(array, <[i64]>::to_vec) {
        return Ok(tokens);
    }
    if kind == b'u' && dtype.itemsize() == 8 {
        // The one integer dtype whose values may not fit i64: checked one by one.
        return numpy_copy::<u64>(py, array)?
            .into_iter()
            .enumerate()
            .map(|(i, token)| {
                i64::try_from(token).map_err(|_| {
                    make_error(py, format!("{}={token}: out of the 64-bit integer range", Indexed(field, i).name()))
                })
            })
            .collect();
    }
    numpy_copy::<i64>(py, array)
}

/// Room for up to `len` items, if the allocator has it; an empty vector otherwise (the
/// items are then pushed with `push`, which fails cleanly).
pub fn reserved<T>(len: usize) -> Vec<T> {
    let mut out = Vec::new();
    // A length a caller gave is only a hint: at most this much is reserved up front.
    const MOST_RESERVED: usize = 1 << 16;
    let _ = out.try_reserve_exact(len.min(MOST_RESERVED));
    out
}

/// Appends `item`, raising `MemoryError` when the vector cannot grow (instead of the
/// allocator aborting the process).
#[inline]
pub fn push<T>(out: &mut Vec<T>, item: T) -> PyResult<()> {
    if out.len() == out.capacity() {
        out.try_reserve(out.len().max(16)).map_err(|_| {
            PyMemoryError::new_err(format!("cannot grow a list of {} items of {} bytes", out.len(), size_of::<T>()))
        })?;
    }
    out.push(item);
    Ok(())
}

/// Hands `each` the items of the iterable `value`, at most `limit.max` of them: an item past
/// the limit is the error `limit.exceeded(field)`, so an endless iterable is refused instead
/// of read until memory runs out. `not_iterable` is the error if `value` is no iterable.
pub fn for_each_bounded<'py>(
    value: &Bound<'py, PyAny>,
    limit: &ListLimit,
    field: &dyn Field,
    not_iterable: impl FnOnce() -> PyErr,
    mut each: impl FnMut(usize, Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    let iter = value.try_iter().map_err(|_| not_iterable())?;
    for (i, item) in iter.enumerate() {
        if i == limit.max {
            return Err(core_err(limit.exceeded(field.name())));
        }
        each(i, item?)?;
    }
    Ok(())
}

/// A token list from a numpy integer array or any iterable of ints, of at most
/// `limit.max` tokens (an iterable is read no further than one token past it).
pub fn token_list(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    field: &dyn Field,
    make_error: fn(Python<'_>, String) -> PyErr,
    limit: &ListLimit,
) -> PyResult<Vec<i64>> {
    if let Ok(array) = value.cast::<PyUntypedArray>() {
        if !limit.allows(array.len()) {
            return Err(core_err(limit.too_long(field.name(), array.len())));
        }
        return array_tokens(py, array, field, make_error);
    }
    if value.is_instance_of::<PyString>() {
        return Err(make_error(py, format!("{}: must be a sequence of token ids, got a str", field.name())));
    }
    // Fast path: a list of exact ints (no bools, no numpy scalars), read in place.
    if let Ok(list) = value.cast::<PyList>() {
        if !limit.allows(list.len()) {
            return Err(core_err(limit.too_long(field.name(), list.len())));
        }
        let mut out = reserved(list.len());
        for item in list.iter() {
            if !item.is_exact_instance_of::<PyInt>() {
                out.clear();
                break;
            }
            match item.extract::<i64>() {
                Ok(token) => push(&mut out, token)?,
                Err(_) => {
                    out.clear();
                    break;
                }
            }
        }
        if out.len() == list.len() {
            return Ok(out);
        }
    }
    let not_iterable =
        || make_error(py, format!("{}: must be a sequence of token ids, got {}", field.name(), type_name(value)));
    let mut out = reserved(value.len().unwrap_or(0).min(limit.max));
    for_each_bounded(value, limit, field, not_iterable, |i, item| {
        push(&mut out, int_value(py, &item, &Indexed(field, i), make_error)?)
    })?;
    Ok(out)
}

/// A request's multimodal inputs: an iterable of ``(identifier, offset, length)`` or
/// ``(identifier, offset, length, is_embed)`` tuples (``is_embed`` an iterable of bools, one
/// per placeholder, or None), at most `limits.0.max` inputs and `limits.1.max` flags each.
pub fn mm_input_list(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    (limit, flags_limit): (&ListLimit, &ListLimit),
    make_error: fn(Python<'_>, String) -> PyErr,
) -> PyResult<Vec<llmsched_core::MmInputSpec>> {
    let field: &dyn Field = &"mm_inputs";
    let mut inputs = Vec::new();
    let not_iterable = || make_error(py, format!("mm_inputs: must be an iterable of tuples, got {}", type_name(value)));
    // A str iterates as characters, never as inputs.
    if value.is_instance_of::<PyString>() {
        return Err(not_iterable());
    }
    for_each_bounded(value, limit, field, not_iterable, |i, item| {
        let at = Indexed(field, i);
        let parts: Vec<Bound<'_, PyAny>> = match item.cast::<pyo3::types::PyTuple>() {
            Ok(tuple) if (3..=4).contains(&tuple.len()) => tuple.iter().collect(),
            _ => {
                return Err(make_error(
                    py,
                    format!(
                        "{}={}: must be a tuple (identifier, offset, length[, is_embed])",
                        at.name(),
                        describe(&item)
                    ),
                ))
            }
        };
        let identifier = parts[0]
            .cast::<PyString>()
            .map_err(|_| {
                make_error(py, format!("{}.identifier: must be a str, got {}", at.name(), type_name(&parts[0])))
            })?
            .to_cow()?
            .into_owned();
        let offset = int_value(py, &parts[1], &format!("{}.offset", at.name()).as_str(), make_error)?;
        let length = int_value(py, &parts[2], &format!("{}.length", at.name()).as_str(), make_error)?;
        let is_embed = match parts.get(3) {
            Some(flags) if !flags.is_none() => {
                let name = format!("{}.is_embed", at.name());
                let mut values = Vec::new();
                let not_iterable = || make_error(py, format!("{name}: must be an iterable of bools"));
                for_each_bounded(flags, flags_limit, &name.as_str(), not_iterable, |j, flag| {
                    values.push(bool_value(py, &flag, &Indexed(&name.as_str(), j), make_error)?);
                    Ok(())
                })?;
                Some(values)
            }
            _ => None,
        };
        inputs.push(llmsched_core::MmInputSpec { identifier, offset, length, is_embed });
        Ok(())
    })?;
    Ok(inputs)
}
