//! A Python object the core asks while it works (a connector): each answer read as the
//! core takes it, the first error kept for the caller to raise after the core's call.

use pyo3::prelude::*;

/// The object, and the first error it met: from then on it is asked nothing more, and the
/// caller's fallback answers instead.
pub struct PySource<'a, 'py> {
    pub source: &'a Bound<'py, PyAny>,
    pub error: Option<PyErr>,
}

impl<'a, 'py> PySource<'a, 'py> {
    pub fn new(source: &'a Bound<'py, PyAny>) -> Self {
        Self { source, error: None }
    }

    /// What `call` returns, read by `read` (an error names `field()`); None once an error
    /// was met, now or before.
    pub fn ask<T>(
        &mut self,
        field: &dyn Fn() -> String,
        call: impl FnOnce(&'a Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
        read: impl FnOnce(Python<'py>, &Bound<'py, PyAny>, &str) -> PyResult<T>,
    ) -> Option<T> {
        if self.error.is_some() {
            return None;
        }
        let source = self.source;
        match call(source).and_then(|answer| read(source.py(), &answer, &field())) {
            Ok(answer) => Some(answer),
            Err(error) => {
                self.error = Some(error);
                None
            }
        }
    }

    /// Calls `call` for its effect (unless an error was met before), keeping its error.
    pub fn tell(&mut self, call: impl FnOnce(&'a Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>) {
        if self.error.is_none() {
            if let Err(error) = call(self.source) {
                self.error = Some(error);
            }
        }
    }
}
