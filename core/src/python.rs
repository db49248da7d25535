//! The Python binding: the extension module `dualpath_emu._core` (built by maturin with feature `python`).
//!
//! A thin layer: it converts arguments, calls the core, and turns every [`crate::CoreError`] into the
//! matching exception class of `dualpath_emu.errors` in one place ([`to_py_err`]).

use pyo3::exceptions::{PyException, PyLookupError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::ErrorKind;

/// The public module the exception classes belong to (their `__module__`); `errors.py` re-exports them.
const ERRORS_MODULE: &str = "dualpath_emu.errors";

pyo3::create_exception!(
    dualpath_emu.errors,
    CoreError,
    PyException,
    "Base class of every error raised by the dualpath-emu core."
);

/// The subclasses of `CoreError`. Each also derives from the built-in exception a caller would naturally
/// catch (`except ValueError` keeps working), which `create_exception!` cannot express: it takes one base.
struct ErrorClasses {
    invalid_argument: Py<PyType>,
    unknown_name: Py<PyType>,
    config: Py<PyType>,
    state: Py<PyType>,
    io: Py<PyType>,
}

static ERROR_CLASSES: PyOnceLock<ErrorClasses> = PyOnceLock::new();

impl ErrorClasses {
    fn get(py: Python<'_>) -> PyResult<&ErrorClasses> {
        ERROR_CLASSES.get_or_try_init(py, || {
            let base = py.get_type::<CoreError>();
            Ok(ErrorClasses {
                invalid_argument: subclass(
                    &base,
                    "InvalidArgumentError",
                    py.get_type::<PyValueError>(),
                    "An argument has a bad value; the message names the argument and what was expected.",
                )?,
                unknown_name: subclass(
                    &base,
                    "UnknownNameError",
                    py.get_type::<PyLookupError>(),
                    "A port, node or transfer id or name that does not exist.",
                )?,
                config: subclass(
                    &base,
                    "ConfigError",
                    py.get_type::<PyValueError>(),
                    "A configuration (e.g. an arbitration table) that cannot be honoured.",
                )?,
                state: subclass(
                    &base,
                    "StateError",
                    py.get_type::<PyRuntimeError>(),
                    "The operation is not allowed in the core's current state.",
                )?,
                io: subclass(&base, "CoreIOError", py.get_type::<PyOSError>(), "Reading or writing a file failed.")?,
            })
        })
    }

    /// `(name, class)` for each subclass, in the order they are added to the module.
    fn named<'a>(&'a self, py: Python<'a>) -> [(&'static str, &'a Bound<'a, PyType>); 5] {
        [
            ("InvalidArgumentError", self.invalid_argument.bind(py)),
            ("UnknownNameError", self.unknown_name.bind(py)),
            ("ConfigError", self.config.bind(py)),
            ("StateError", self.state.bind(py)),
            ("CoreIOError", self.io.bind(py)),
        ]
    }
}

/// `class <name>(CoreError, <builtin>)` in `dualpath_emu.errors`, made as Python's `class` statement would.
fn subclass<'py>(
    core_error: &Bound<'py, PyType>,
    name: &str,
    builtin: Bound<'py, PyType>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let py = core_error.py();
    let bases = PyTuple::new(py, [core_error.clone(), builtin])?;
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", ERRORS_MODULE)?;
    namespace.set_item("__doc__", doc)?;
    let class = py.get_type::<PyType>().call1((name, bases, namespace))?;
    Ok(class.cast_into::<PyType>()?.unbind())
}

/// Converts a core error to the matching `dualpath_emu.errors` exception, keeping its message.
pub(crate) fn to_py_err(e: crate::CoreError) -> PyErr {
    Python::attach(|py| {
        let classes = match ErrorClasses::get(py) {
            Ok(classes) => classes,
            Err(err) => return err,
        };
        let class = match e.kind {
            ErrorKind::InvalidArgument => &classes.invalid_argument,
            ErrorKind::Unknown => &classes.unknown_name,
            ErrorKind::Config => &classes.config,
            ErrorKind::State => &classes.state,
            ErrorKind::Io => &classes.io,
        };
        PyErr::from_type(class.bind(py).clone(), e.message)
    })
}

/// Lets `?` convert core errors inside `#[pymethods]`.
impl From<crate::CoreError> for PyErr {
    fn from(e: crate::CoreError) -> Self {
        to_py_err(e)
    }
}

/// The extension module, imported as `dualpath_emu._core`.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CoreError", py.get_type::<CoreError>())?;
    for (name, class) in ErrorClasses::get(py)?.named(py) {
        m.add(name, class)?;
    }
    Ok(())
}
