//! The Python binding: the extension module `dualpath_emu._core` (built by maturin with feature `python`).
//!
//! A thin layer: it converts arguments, calls the core, and turns every [`crate::CoreError`] into the
//! matching exception class of `dualpath_emu.errors` in one place ([`to_py_err`]).

use pyo3::exceptions::{PyException, PyLookupError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyList, PyTuple, PyType};

use crate::decode::{DecodeJoin, DecodeNodeSpec, DecodePricing};
use crate::forward::{ForwardRank, ForwardSpec, LayerTransfer};
use crate::lanes::{LaneShares, PacketArbiter, VlArbitration, MAX_LANES};
use crate::packet_port::{PacketPort, DEFAULT_CHUNK_BYTES};
use crate::sim::{ClockMode, Completion, Core, CoreConfig};
use crate::storage::{IoKind, StorageNodeSpec, StorageSpec};
use crate::{ErrorKind, PortSpec};

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

// ---------------------------------------------------------------------------------------------------
// Argument conversion: every bad value becomes an InvalidArgumentError naming the argument.

fn invalid(arg: &str, expected: impl std::fmt::Display) -> PyErr {
    to_py_err(crate::CoreError::invalid(arg, expected))
}

/// A Python int in 0..=max, or an error naming `arg`.
fn int_in(obj: &Bound<'_, PyAny>, arg: &str, max: u64) -> PyResult<u64> {
    let value: i128 = obj.extract().map_err(|_| {
        if obj.is_instance_of::<PyInt>() {
            return invalid(arg, format!("an integer in 0..={max}, got an integer beyond 128 bits"));
        }
        let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        invalid(arg, format!("an integer, got {ty}"))
    })?;
    if value < 0 || value > max as i128 {
        return Err(invalid(arg, format!("an integer in 0..={max}, got {value}")));
    }
    Ok(value as u64)
}

/// A Python number (int or float), or an error naming `arg`; the core checks its range.
fn number(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<f64> {
    obj.extract::<f64>().map_err(|_| {
        if obj.is_instance_of::<PyInt>() {
            return invalid(arg, "a number, got an integer beyond the float range");
        }
        let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        invalid(arg, format!("a number, got {ty}"))
    })
}

/// An integer argument with a default. PyO3 writes a Python default only for a literal of the
/// argument's Rust type, and a `u64` argument would turn -1 into an OverflowError that names nothing;
/// so this holds the object given, checked by `int_in` like every other argument, or the default (the
/// method's `text_signature` shows it; the Python tests check that the two agree).
enum IntArg<'py> {
    Given(Bound<'py, PyAny>),
    Default(u64),
}

impl<'a, 'py> FromPyObject<'a, 'py> for IntArg<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self::Given(obj.to_owned()))
    }
}

impl IntArg<'_> {
    /// The value in 0..=max, or an error naming `arg`.
    fn value(&self, arg: &str, max: u64) -> PyResult<u64> {
        match self {
            Self::Given(obj) => int_in(obj, arg, max),
            Self::Default(v) => Ok(*v),
        }
    }
}

fn lane_of(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u8> {
    Ok(int_in(obj, arg, MAX_LANES as u64 - 1)? as u8)
}

fn id_of(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u32> {
    Ok(int_in(obj, arg, u32::MAX as u64)? as u32)
}

fn path_of(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<u32>> {
    let items = obj.try_iter().map_err(|_| invalid(arg, "a sequence of port ids"))?;
    items.enumerate().map(|(i, item)| id_of(&item?, &format!("{arg}[{i}]"))).collect()
}

/// Unpack `item` (a tuple or list) into exactly `N` fields, or an error naming `arg` and the fields.
fn fields<'py, const N: usize>(item: &Bound<'py, PyAny>, arg: &str, names: &str) -> PyResult<[Bound<'py, PyAny>; N]> {
    let values: Vec<Bound<'py, PyAny>> = item
        .try_iter()
        .and_then(|it| it.collect::<PyResult<Vec<_>>>())
        .map_err(|_| invalid(arg, format!("a tuple ({names})")))?;
    values.try_into().map_err(|v: Vec<_>| invalid(arg, format!("a tuple ({names}) of {N} fields, got {}", v.len())))
}

// The forward-pass conversions run once per field of every forward (thousands of fields per call), so
// they name the argument only when it is wrong: `name` builds it on the error path.

/// A Python int in 0..=max; `name()` is the argument's name, built only for an error.
fn int_named(obj: &Bound<'_, PyAny>, max: u64, name: impl FnOnce() -> String) -> PyResult<u64> {
    match obj.extract::<u64>() {
        Ok(v) if v <= max => Ok(v),
        _ => int_in(obj, &name(), max),
    }
}

/// The items of an iterable (a list or tuple directly), or an error naming it and what was expected.
fn items_named<'py>(
    obj: &Bound<'py, PyAny>,
    expected: &str,
    name: impl FnOnce() -> String,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    obj.try_iter().and_then(|it| it.collect::<PyResult<Vec<_>>>()).map_err(|_| invalid(&name(), expected))
}

/// Exactly `N` fields of a tuple (or any iterable), or an error naming it and the fields.
fn fields_named<'py, const N: usize>(
    obj: &Bound<'py, PyAny>,
    names: &str,
    name: impl Fn() -> String,
) -> PyResult<[Bound<'py, PyAny>; N]> {
    let values = match items_named(obj, "", &name) {
        Ok(values) => values,
        Err(_) => return Err(invalid(&name(), format!("a tuple ({names})"))),
    };
    values.try_into().map_err(|v: Vec<_>| invalid(&name(), format!("a tuple ({names}) of {N} fields, got {}", v.len())))
}

/// `[(context, first block, blocks)]`: which Full Blocks an I/O moves.
fn extents_of(obj: &Bound<'_, PyAny>, name: &dyn Fn() -> String) -> PyResult<Vec<(u64, u64, u64)>> {
    let runs = items_named(obj, "a sequence of (context, first block, blocks)", name)?;
    runs.iter()
        .enumerate()
        .map(|(k, run)| {
            let at = || format!("{}[{k}]", name());
            let [c, first, n] = fields_named::<3>(run, "context, first, blocks", at)?;
            Ok((int_named(&c, u64::MAX, at)?, int_named(&first, u64::MAX, at)?, int_named(&n, u64::MAX, at)?))
        })
        .collect()
}

/// `(path, lane, size_bytes)`: a transfer repeated in every layer.
fn layer_transfer(obj: &Bound<'_, PyAny>, name: &dyn Fn() -> String) -> PyResult<LayerTransfer> {
    let [path, lane, size] = fields_named::<3>(obj, "path, lane, size_bytes", name)?;
    transfer_of(&path, &lane, &size, name)
}

/// A transfer's `path`, `lane` and `size_bytes` fields, checked; `name()` (the transfer's) only for an error.
fn transfer_of(
    path: &Bound<'_, PyAny>,
    lane: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
    name: &dyn Fn() -> String,
) -> PyResult<LayerTransfer> {
    let path = items_named(path, "a sequence of port ids", || format!("{}.path", name()))?
        .iter()
        .enumerate()
        .map(|(i, p)| Ok(int_named(p, u32::MAX as u64, || format!("{}.path[{i}]", name()))? as u32))
        .collect::<PyResult<Vec<u32>>>()?;
    let lane = int_named(lane, MAX_LANES as u64 - 1, || format!("{}.lane", name()))? as u8;
    let size_bytes = int_named(size, u64::MAX, || format!("{}.size_bytes", name()))?;
    Ok(LayerTransfer { path, lane, size_bytes })
}

/// `None` or a layer transfer.
fn optional_transfer(obj: &Bound<'_, PyAny>, name: &dyn Fn() -> String) -> PyResult<Option<LayerTransfer>> {
    if obj.is_none() {
        Ok(None)
    } else {
        layer_transfer(obj, name).map(Some)
    }
}

/// `(n_layers, ranks, ffn_ns, collectives, load_window, tag)`, each rank `(load, attn_ns, store)`.
fn forward_of(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<(ForwardSpec, u64)> {
    let at = || format!("forwards[{i}]");
    let [n_layers, ranks, ffn_ns, collectives, load_window, tag] =
        fields_named::<6>(obj, "n_layers, ranks, ffn_ns, collectives, load_window, tag", at)?;
    let n_layers = int_named(&n_layers, u32::MAX as u64, || format!("{}.n_layers", at()))? as u32;
    let ranks = items_named(&ranks, "a sequence of (load, attn_ns, store)", || format!("{}.ranks", at()))?
        .iter()
        .enumerate()
        .map(|(r, rank)| {
            let at = || format!("{}.ranks[{r}]", at());
            let [load, attn_ns, store] = fields_named::<3>(rank, "load, attn_ns, store", at)?;
            Ok(ForwardRank {
                load: optional_transfer(&load, &|| format!("{}.load", at()))?,
                attn_ns: int_named(&attn_ns, u64::MAX, || format!("{}.attn_ns", at()))?,
                store: optional_transfer(&store, &|| format!("{}.store", at()))?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let ffn_ns = int_named(&ffn_ns, u64::MAX, || format!("{}.ffn_ns", at()))?;
    let collectives =
        items_named(&collectives, "a sequence of (path, lane, size_bytes)", || format!("{}.collectives", at()))?
            .iter()
            .enumerate()
            .map(|(c, t)| layer_transfer(t, &|| format!("{}.collectives[{c}]", at())))
            .collect::<PyResult<Vec<_>>>()?;
    let load_window = int_named(&load_window, u32::MAX as u64, || format!("{}.load_window", at()))? as u32;
    let tag = int_named(&tag, u64::MAX, || format!("{}.tag", at()))?;
    Ok((ForwardSpec { n_layers, ranks, ffn_ns, collectives, load_window }, tag))
}

fn completions_to_list<'py>(py: Python<'py>, done: Vec<Completion>) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for c in done {
        let kind = match c.kind {
            crate::CompletionKind::Transfer => intern!(py, "transfer"),
            crate::CompletionKind::Read => intern!(py, "read"),
            crate::CompletionKind::Write => intern!(py, "write"),
            crate::CompletionKind::Timer => intern!(py, "timer"),
            crate::CompletionKind::Forward => intern!(py, "forward"),
            crate::CompletionKind::Decoded => intern!(py, "decoded"),
            crate::CompletionKind::External => intern!(py, "external"),
        };
        list.append((kind, c.tag, c.start_ns, c.end_ns, c.size_bytes, c.lane))?;
    }
    Ok(list)
}

// ---------------------------------------------------------------------------------------------------

/// A port's virtual-lane arbitration (InfiniBand `qos_*` knobs); see `lanes.rs`.
#[pyclass(module = "dualpath_emu._core", name = "Arbitration", frozen)]
#[derive(Clone)]
pub struct PyArbitration {
    inner: VlArbitration,
}

impl PyArbitration {
    fn checked(inner: VlArbitration) -> PyResult<Self> {
        inner.validate()?;
        Ok(Self { inner })
    }

    fn shares(&self, mtu_bytes: &Bound<'_, PyAny>) -> PyResult<LaneShares> {
        let mtu = int_in(mtu_bytes, "mtu_bytes", u32::MAX as u64)? as u32;
        Ok(self.inner.rate_model(mtu)?)
    }
}

fn table(entries: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<(u8, u8)>> {
    let items = entries.try_iter().map_err(|_| invalid(arg, "a sequence of (lane, weight) pairs"))?;
    items
        .enumerate()
        .map(|(i, item)| {
            let [lane, weight] = fields::<2>(&item?, &format!("{arg}[{i}]"), "lane, weight")?;
            Ok((
                lane_of(&lane, &format!("{arg}[{i}].lane"))?,
                int_in(&weight, &format!("{arg}[{i}].weight"), 255)? as u8,
            ))
        })
        .collect()
}

#[pymethods]
impl PyArbitration {
    /// From the operator's knobs, e.g. `parse(4, 240, "0:192,1:192,2:0,3:192", "0:192,1:192,2:64,3:192")`.
    #[staticmethod]
    fn parse(
        max_vls: &Bound<'_, PyAny>,
        high_limit: &Bound<'_, PyAny>,
        vlarb_high: &str,
        vlarb_low: &str,
    ) -> PyResult<Self> {
        let max_vls = int_in(max_vls, "qos_max_vls", 255)? as u8;
        let high_limit = int_in(high_limit, "qos_high_limit", 255)? as u8;
        Ok(Self { inner: VlArbitration::parse(max_vls, high_limit, vlarb_high, vlarb_low)? })
    }

    /// The paper's App. A.1 configuration (VL2 carries KV traffic at low priority).
    #[staticmethod]
    fn paper() -> Self {
        Self { inner: VlArbitration::paper() }
    }

    /// `high` lanes strictly before `low` lanes.
    #[staticmethod]
    fn strict_priority(high: &Bound<'_, PyAny>, low: &Bound<'_, PyAny>) -> PyResult<Self> {
        let lanes = |obj: &Bound<'_, PyAny>, arg: &str| -> PyResult<Vec<u8>> {
            let items = obj.try_iter().map_err(|_| invalid(arg, "a sequence of lanes"))?;
            items.enumerate().map(|(i, l)| lane_of(&l?, &format!("{arg}[{i}]"))).collect()
        };
        Self::checked(VlArbitration::strict_priority(&lanes(high, "high")?, &lanes(low, "low")?))
    }

    /// One table of (lane, weight) entries, weights in 64-byte units.
    #[staticmethod]
    fn weighted_round_robin(entries: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::checked(VlArbitration::weighted_round_robin(&table(entries, "entries")?))
    }

    /// No QoS: lanes 0..n_lanes share equally (PCIe, DRAM).
    #[staticmethod]
    fn fair(n_lanes: &Bound<'_, PyAny>) -> PyResult<Self> {
        let n = int_in(n_lanes, "n_lanes", 15)?;
        if n == 0 {
            return Err(invalid("n_lanes", "an integer in 1..=15, got 0"));
        }
        Self::checked(VlArbitration::fair(n as u8))
    }

    #[getter]
    fn max_vls(&self) -> u8 {
        self.inner.max_vls
    }

    #[getter]
    fn high_limit(&self) -> u8 {
        self.inner.high_limit
    }

    #[getter]
    fn high(&self) -> Vec<(u8, u8)> {
        self.inner.high.iter().map(|e| (e.vl, e.weight)).collect()
    }

    #[getter]
    fn low(&self) -> Vec<(u8, u8)> {
        self.inner.low.iter().map(|e| (e.vl, e.weight)).collect()
    }

    /// Long-run share of the port of each of the 16 lanes when exactly `backlogged` lanes always have data.
    fn saturated_shares(&self, mtu_bytes: &Bound<'_, PyAny>, backlogged: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
        let shares = self.shares(mtu_bytes)?;
        let mut mask = 0u16;
        for (i, lane) in backlogged.try_iter().map_err(|_| invalid("backlogged", "a sequence of lanes"))?.enumerate() {
            mask |= 1 << lane_of(&lane?, &format!("backlogged[{i}]"))?;
        }
        Ok(shares.saturated_shares(mask).to_vec())
    }

    /// The rate model: split `capacity` among lanes with these demands (up to 16, inf allowed).
    fn allocate(&self, mtu_bytes: &Bound<'_, PyAny>, capacity: f64, demands: Vec<f64>) -> PyResult<Vec<f64>> {
        let shares = self.shares(mtu_bytes)?;
        if !(capacity.is_finite() && capacity > 0.0) {
            return Err(invalid("capacity", format!("a finite number > 0, got {capacity}")));
        }
        if demands.len() > MAX_LANES || demands.iter().any(|d| d.is_nan() || *d < 0.0) {
            return Err(invalid("demands", format!("at most {MAX_LANES} numbers >= 0")));
        }
        let mut demand = [0.0; MAX_LANES];
        demand[..demands.len()].copy_from_slice(&demands);
        let mut out = [0.0; MAX_LANES];
        shares.allocate(capacity, &demand, &mut out);
        Ok(out.to_vec())
    }

    fn __repr__(&self) -> String {
        let fmt = |t: &[crate::lanes::VlArbEntry]| {
            t.iter().map(|e| format!("{}:{}", e.vl, e.weight)).collect::<Vec<_>>().join(",")
        };
        format!(
            "Arbitration.parse({}, {}, {:?}, {:?})",
            self.inner.max_vls,
            self.inner.high_limit,
            fmt(&self.inner.high),
            fmt(&self.inner.low)
        )
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

/// The exact per-packet arbiter (the reference semantics of `Arbitration`).
#[pyclass(module = "dualpath_emu._core", name = "PacketArbiter")]
pub struct PyPacketArbiter {
    inner: PacketArbiter,
}

#[pymethods]
impl PyPacketArbiter {
    #[new]
    fn new(arbitration: &PyArbitration) -> PyResult<Self> {
        Ok(Self { inner: PacketArbiter::new(&arbitration.inner)? })
    }

    /// `head_bytes[l]`: size of lane l's next packet (0: empty). Returns the lane sent next, or None.
    fn select(&mut self, head_bytes: &Bound<'_, PyAny>) -> PyResult<Option<u8>> {
        let mut heads = [0u32; MAX_LANES];
        let items = head_bytes.try_iter().map_err(|_| invalid("head_bytes", "a sequence of packet sizes"))?;
        for (i, item) in items.enumerate() {
            if i >= MAX_LANES {
                return Err(invalid("head_bytes", format!("at most {MAX_LANES} lanes")));
            }
            heads[i] = int_in(&item?, &format!("head_bytes[{i}]"), u32::MAX as u64)? as u32;
        }
        Ok(self.inner.select(&heads))
    }
}

/// A token-bucket pacer with virtual-lane arbitration over chunks of real bytes (see `packet_port.rs`):
/// a backend enqueues messages, asks which chunks it may move now, and moves them itself.
#[pyclass(module = "dualpath_emu._core", name = "PacketPort")]
pub struct PyPacketPort {
    inner: PacketPort,
}

/// `None` (all lanes) or a lane in 0..MAX_LANES, as the counters take it.
fn optional_lane(lane: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u8>> {
    lane.map(|l| lane_of(l, "lane")).transpose()
}

#[pymethods]
impl PyPacketPort {
    #[new]
    #[pyo3(
        signature = (rate_bytes_per_s, *, burst_bytes = None, arbitration = None, chunk_bytes = IntArg::Default(DEFAULT_CHUNK_BYTES as u64)),
        text_signature = "(rate_bytes_per_s, *, burst_bytes=None, arbitration=None, chunk_bytes=65536)"
    )]
    fn new(
        rate_bytes_per_s: &Bound<'_, PyAny>,
        burst_bytes: Option<&Bound<'_, PyAny>>,
        arbitration: Option<PyRef<'_, PyArbitration>>,
        chunk_bytes: IntArg<'_>,
    ) -> PyResult<Self> {
        let rate = number(rate_bytes_per_s, "rate_bytes_per_s")?;
        let burst = burst_bytes.map(|b| number(b, "burst_bytes")).transpose()?;
        let chunk = chunk_bytes.value("chunk_bytes", u32::MAX as u64)? as u32;
        Ok(Self { inner: PacketPort::new(rate, burst, arbitration.as_ref().map(|a| &a.inner), chunk)? })
    }

    /// Queue a message of `size_bytes` on `lane` with the caller's `tag`; it leaves in chunks.
    fn enqueue(
        &mut self,
        lane: &Bound<'_, PyAny>,
        size_bytes: &Bound<'_, PyAny>,
        tag: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let lane = lane_of(lane, "lane")?;
        let size = int_in(size_bytes, "size_bytes", u64::MAX)?;
        Ok(self.inner.enqueue(lane, size, int_in(tag, "tag", u64::MAX)?)?)
    }

    /// The chunks the caller may move at `now_ns`, in order: `(tag, lane, chunk_bytes, last_chunk)`.
    #[pyo3(
        signature = (now_ns, max_chunks = IntArg::Default(4096)),
        text_signature = "($self, now_ns, max_chunks=4096)"
    )]
    fn grant(&mut self, now_ns: &Bound<'_, PyAny>, max_chunks: IntArg<'_>) -> PyResult<Vec<(u64, u8, u32, bool)>> {
        let now_ns = int_in(now_ns, "now_ns", u64::MAX)?;
        let max_chunks = max_chunks.value("max_chunks", usize::MAX as u64)? as usize;
        let grants = self.inner.grant(now_ns, max_chunks)?;
        Ok(grants.into_iter().map(|g| (g.tag, g.lane, g.bytes, g.last)).collect())
    }

    /// The earliest time >= `now_ns` at which `grant` grants a chunk; None if nothing is queued.
    fn next_grant_ns(&self, now_ns: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(self.inner.next_grant_ns(int_in(now_ns, "now_ns", u64::MAX)?)?)
    }

    /// Refill at `rate_bytes_per_s` (>= 0; 0 pauses the port) up to `burst_bytes` (None: as it was) from
    /// `now_ns` on, keeping the tokens earned at the old rate until then (a fault: a degraded or dead port).
    #[pyo3(
        signature = (now_ns, rate_bytes_per_s, burst_bytes = None),
        text_signature = "($self, now_ns, rate_bytes_per_s, burst_bytes=None)"
    )]
    fn set_rate(
        &mut self,
        now_ns: &Bound<'_, PyAny>,
        rate_bytes_per_s: &Bound<'_, PyAny>,
        burst_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let now_ns = int_in(now_ns, "now_ns", u64::MAX)?;
        let rate = number(rate_bytes_per_s, "rate_bytes_per_s")?;
        let burst = burst_bytes.map(|b| number(b, "burst_bytes")).transpose()?;
        Ok(self.inner.set_rate(now_ns, rate, burst)?)
    }

    /// Whether the port is paused (rate 0).
    #[getter]
    fn paused(&self) -> bool {
        self.inner.paused()
    }

    /// Drop the chunks not yet granted of the messages tagged `tag`; returns the bytes dropped.
    fn cancel(&mut self, tag: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.inner.cancel(int_in(tag, "tag", u64::MAX)?))
    }

    /// Bytes queued and not yet granted on `lane` (all lanes if None).
    #[pyo3(signature = (lane = None))]
    fn queued_bytes(&self, lane: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        Ok(self.inner.queued_bytes(optional_lane(lane)?)?)
    }

    /// Bytes granted so far on `lane` (all lanes if None).
    #[pyo3(signature = (lane = None))]
    fn granted_bytes(&self, lane: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        Ok(self.inner.granted_bytes(optional_lane(lane)?)?)
    }

    /// Messages with chunks not yet granted.
    fn queued_messages(&self) -> usize {
        self.inner.queued_messages()
    }

    #[getter]
    fn rate_bytes_per_s(&self) -> f64 {
        self.inner.rate_bytes_per_s()
    }

    #[getter]
    fn burst_bytes(&self) -> f64 {
        self.inner.burst_bytes()
    }

    #[getter]
    fn chunk_bytes(&self) -> u32 {
        self.inner.chunk_bytes()
    }
}

/// The data-plane core: ports, transfers, storage and timers on one clock, driven in batches.
/// Times are integer nanoseconds; rates are bytes per second.
#[pyclass(module = "dualpath_emu._core", name = "Core")]
pub struct PyCore {
    core: Core,
}

#[pymethods]
impl PyCore {
    #[new]
    #[pyo3(signature = (*, clock = "virtual", time_scale = 1.0, sample_interval_ns = None, record_spans = false, wall_elapsed_ns = None))]
    fn new(
        clock: &str,
        time_scale: f64,
        sample_interval_ns: Option<&Bound<'_, PyAny>>,
        record_spans: bool,
        wall_elapsed_ns: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let clock = match clock {
            "virtual" => ClockMode::Virtual,
            "wall" => ClockMode::Wall { time_scale },
            other => return Err(invalid("clock", format!("\"virtual\" or \"wall\", got {other:?}"))),
        };
        let sample_interval_ns = match sample_interval_ns {
            Some(v) => int_in(v, "sample_interval_ns", u64::MAX)?,
            None => 0,
        };
        let wall_elapsed_ns = match wall_elapsed_ns {
            Some(_) if clock == ClockMode::Virtual => {
                return Err(invalid("wall_elapsed_ns", "only with clock=\"wall\""));
            }
            Some(v) => int_in(v, "wall_elapsed_ns", u64::MAX)?,
            None => 0,
        };
        let config = CoreConfig { clock, sample_interval_ns, record_spans, wall_elapsed_ns, ..CoreConfig::default() };
        Ok(Self { core: Core::new(config)? })
    }

    /// Add a port; returns its id. `peak_bytes_per_s` > rate with `burst_bytes` > 0 makes a token bucket.
    #[pyo3(signature = (name, rate_bytes_per_s, *, peak_bytes_per_s = None, burst_bytes = None, mtu_bytes = None, arbitration = None))]
    fn add_port(
        &mut self,
        name: String,
        rate_bytes_per_s: &Bound<'_, PyAny>,
        peak_bytes_per_s: Option<&Bound<'_, PyAny>>,
        burst_bytes: Option<&Bound<'_, PyAny>>,
        mtu_bytes: Option<&Bound<'_, PyAny>>,
        arbitration: Option<PyRef<'_, PyArbitration>>,
    ) -> PyResult<u32> {
        let rate = number(rate_bytes_per_s, "rate_bytes_per_s")?;
        let mut spec = PortSpec::plain(name, rate);
        spec.peak_bytes_per_s = peak_bytes_per_s.map(|p| number(p, "peak_bytes_per_s")).transpose()?.unwrap_or(rate);
        spec.burst_bytes = burst_bytes.map(|b| number(b, "burst_bytes")).transpose()?.unwrap_or(0.0);
        if let Some(mtu) = mtu_bytes {
            spec.mtu_bytes = int_in(mtu, "mtu_bytes", u32::MAX as u64)? as u32;
        }
        if let Some(a) = arbitration {
            spec.arbitration = a.inner.clone();
        }
        Ok(self.core.add_port(spec)?)
    }

    fn port_id(&self, name: &str) -> PyResult<u32> {
        Ok(self.core.port_id(name)?)
    }

    fn port_name(&self, port: &Bound<'_, PyAny>) -> PyResult<String> {
        Ok(self.core.port_spec(id_of(port, "port")?)?.name.clone())
    }

    /// Sustained rate of a port (bytes/s).
    fn port_rate(&self, port: &Bound<'_, PyAny>) -> PyResult<f64> {
        Ok(self.core.port_spec(id_of(port, "port")?)?.rate_bytes_per_s)
    }

    #[getter]
    fn port_count(&self) -> usize {
        self.core.port_count()
    }

    /// The storage cluster: the ports its reads leave by and its writes enter by, and per-I/O latencies.
    #[pyo3(signature = (*, read_port, write_port, read_latency_ns, write_latency_ns))]
    fn configure_storage(
        &mut self,
        read_port: &Bound<'_, PyAny>,
        write_port: &Bound<'_, PyAny>,
        read_latency_ns: &Bound<'_, PyAny>,
        write_latency_ns: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        Ok(self.core.configure_storage(StorageSpec {
            read_port: id_of(read_port, "read_port")?,
            write_port: id_of(write_port, "write_port")?,
            read_latency_ns: int_in(read_latency_ns, "read_latency_ns", u64::MAX)?,
            write_latency_ns: int_in(write_latency_ns, "write_latency_ns", u64::MAX)?,
        })?)
    }

    /// A node attached to storage; returns its id.
    #[pyo3(signature = (name, *, read_path, write_path, queue_depth))]
    fn add_storage_node(
        &mut self,
        name: String,
        read_path: &Bound<'_, PyAny>,
        write_path: &Bound<'_, PyAny>,
        queue_depth: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        Ok(self.core.add_storage_node(StorageNodeSpec {
            name,
            read_path: path_of(read_path, "read_path")?,
            write_path: path_of(write_path, "write_path")?,
            queue_depth: int_in(queue_depth, "queue_depth", u32::MAX as u64)? as u32,
        })?)
    }

    fn storage_node_id(&self, name: &str) -> PyResult<u32> {
        Ok(self.core.storage_node_id(name)?)
    }

    /// The name a storage node was added with.
    fn storage_node_name(&self, node: &Bound<'_, PyAny>) -> PyResult<String> {
        Ok(self.core.storage_node_name(id_of(node, "node")?)?.to_owned())
    }

    /// How many storage nodes there are (their ids are 0, 1, …).
    #[getter]
    fn storage_node_count(&self) -> usize {
        self.core.storage_node_count()
    }

    /// Start many transfers now: an iterable of `(path, lane, size_bytes, tag)`. All are checked before
    /// any is accepted, so a bad one leaves the core unchanged. Returns how many were submitted.
    ///
    /// With `latency_sensitive_outstanding_bytes` > 0 every transfer of the batch is latency-sensitive: it
    /// first waits behind the bulk data queued FIFO on its lane (per port, the sum over that lane's flows of
    /// min(remaining bytes, this cap), served at the lane's current rate; the longest wait along the path),
    /// then moves as an ordinary transfer; its completion's start is the submission (Core::
    /// submit_latency_sensitive in the Rust docs).
    #[pyo3(
        signature = (transfers, *, latency_sensitive_outstanding_bytes = IntArg::Default(0)),
        text_signature = "($self, transfers, *, latency_sensitive_outstanding_bytes=0)"
    )]
    fn submit_transfers(
        &mut self,
        transfers: &Bound<'_, PyAny>,
        latency_sensitive_outstanding_bytes: IntArg<'_>,
    ) -> PyResult<usize> {
        let outstanding = latency_sensitive_outstanding_bytes.value("latency_sensitive_outstanding_bytes", u64::MAX)?;
        let items =
            transfers.try_iter().map_err(|_| invalid("transfers", "an iterable of (path, lane, size_bytes, tag)"))?;
        let mut batch = Vec::new();
        // Checked field by field; the argument's name is built only for an error (this runs per transfer).
        for (i, item) in items.enumerate() {
            let arg = || format!("transfers[{i}]");
            let [path, lane, size, tag] = fields_named::<4>(&item?, "path, lane, size_bytes, tag", arg)?;
            let LayerTransfer { path, lane, size_bytes } = transfer_of(&path, &lane, &size, &arg)?;
            let tag = int_named(&tag, u64::MAX, || format!("{}.tag", arg()))?;
            batch.push((path, lane, size_bytes, tag));
        }
        self.core.submit_latency_sensitive(&batch, outstanding)?;
        Ok(batch.len())
    }

    /// Add one node's decode GPUs, stepped by the core (`decode.rs`); returns the node's id. `pricing` is a
    /// dict of the step-pricing constants (`DecodePricing`'s fields), `storage_node` None for no write-backs,
    /// `write_through` False for blocks that stop in the node's DRAM (a pool written back on eviction).
    #[pyo3(signature = (*, gpus, together, pricing, kv_bytes_per_token, a2a_bytes_per_token, a2a_paths, a2a_lane,
                        d2h_paths, storage_node, kv_lane, first_unit, report_tag, write_through=true))]
    #[allow(clippy::too_many_arguments)]
    fn add_decode_node(
        &mut self,
        gpus: &Bound<'_, PyAny>,
        together: bool,
        pricing: &Bound<'_, PyDict>,
        kv_bytes_per_token: &Bound<'_, PyAny>,
        a2a_bytes_per_token: &Bound<'_, PyAny>,
        a2a_paths: &Bound<'_, PyAny>,
        a2a_lane: &Bound<'_, PyAny>,
        d2h_paths: &Bound<'_, PyAny>,
        storage_node: Option<&Bound<'_, PyAny>>,
        kv_lane: &Bound<'_, PyAny>,
        first_unit: &Bound<'_, PyAny>,
        report_tag: &Bound<'_, PyAny>,
        write_through: bool,
    ) -> PyResult<u32> {
        let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
            pricing.get_item(key)?.ok_or_else(|| invalid(&format!("pricing.{key}"), "a value (missing)"))
        };
        let int = |key: &str| -> PyResult<u64> { int_in(&get(key)?, &format!("pricing.{key}"), u32::MAX as u64) };
        let float = |key: &str| -> PyResult<f64> { number(&get(key)?, &format!("pricing.{key}")) };
        let top_k = get("sparse_top_k")?;
        let pricing = DecodePricing {
            layers: int("layers")?,
            moe_layers: int("moe_layers")?,
            overhead_s_per_layer: float("overhead_s_per_layer")?,
            sparse_top_k: if top_k.is_none() {
                None
            } else {
                Some(int_in(&top_k, "pricing.sparse_top_k", u32::MAX as u64)?)
            },
            attention_flops_per_key: int("attention_flops_per_key")?,
            indexer_flops_per_key: int("indexer_flops_per_key")?,
            kv_bytes_per_key: int("kv_bytes_per_key")?,
            indexer_bytes_per_key: int("indexer_bytes_per_key")?,
            attention_flops_per_s: float("attention_flops_per_s")?,
            attention_bytes_per_s: float("attention_bytes_per_s")?,
            gemm_flops_per_token: float("gemm_flops_per_token")?,
            gemm_peak_flops_per_s: float("gemm_peak_flops_per_s")?,
            gemm_efficiency: float("gemm_efficiency")?,
            weight_bytes: float("weight_bytes")?,
            hbm_bytes_per_s: float("hbm_bytes_per_s")?,
            memory_efficiency: float("memory_efficiency")?,
            a2a: get("a2a")?.is_truthy()?,
            a2a_fixed_s: float("a2a_fixed_s")?,
            a2a_bytes_per_token_layer: int("a2a_bytes_per_token_layer")?,
            a2a_remote_bytes_per_token: float("a2a_remote_bytes_per_token")?,
            a2a_local_peers: int("a2a_local_peers")?,
            ep_degree: int("ep_degree")?,
            cnic_bytes_per_s: float("cnic_bytes_per_s")?,
            nvlink_bytes_per_s: float("nvlink_bytes_per_s")?,
        };
        let paths = |obj: &Bound<'_, PyAny>, arg: &str| -> PyResult<Vec<Vec<u32>>> {
            let items = obj.try_iter().map_err(|_| invalid(arg, "a sequence of paths"))?;
            items.enumerate().map(|(i, p)| path_of(&p?, &format!("{arg}[{i}]"))).collect()
        };
        let spec = DecodeNodeSpec {
            gpus: int_in(gpus, "gpus", 1 << 16)? as usize,
            together,
            pricing,
            kv_bytes_per_token: int_in(kv_bytes_per_token, "kv_bytes_per_token", u32::MAX as u64)?,
            a2a_bytes_per_token: number(a2a_bytes_per_token, "a2a_bytes_per_token")?,
            a2a_paths: paths(a2a_paths, "a2a_paths")?,
            a2a_lane: lane_of(a2a_lane, "a2a_lane")?,
            d2h_paths: paths(d2h_paths, "d2h_paths")?,
            storage_node: storage_node.map(|n| id_of(n, "storage_node")).transpose()?,
            kv_lane: lane_of(kv_lane, "kv_lane")?,
            first_unit: int_in(first_unit, "first_unit", u32::MAX as u64)?,
            report_tag: int_in(report_tag, "report_tag", u64::MAX)?,
            write_through,
        };
        if !(spec.a2a_bytes_per_token.is_finite() && spec.a2a_bytes_per_token >= 0.0) {
            return Err(invalid("a2a_bytes_per_token", "a finite number >= 0"));
        }
        Ok(self.core.add_decode_node(spec)?)
    }

    /// Requests join their decode GPUs' batches now: an iterable of `(node, gpu, rid, prompt, gen, produced,
    /// stored_blocks, context)`, checked all before any is accepted.
    fn submit_decode_joins(&mut self, joins: &Bound<'_, PyAny>) -> PyResult<usize> {
        let items = joins.try_iter().map_err(|_| {
            invalid("joins", "an iterable of (node, gpu, rid, prompt, gen, produced, stored_blocks, context)")
        })?;
        let mut batch = Vec::new();
        for (i, item) in items.enumerate() {
            let arg = || format!("joins[{i}]");
            let [node, gpu, rid, prompt, gen, produced, stored, context] =
                fields_named::<8>(&item?, "node, gpu, rid, prompt, gen, produced, stored_blocks, context", arg)?;
            let small = |v: &Bound<'_, PyAny>, f: &str| int_named(v, i64::MAX as u64, || format!("{}.{f}", arg()));
            let join = DecodeJoin {
                gpu: small(&gpu, "gpu")? as usize,
                rid: int_named(&rid, u64::MAX, || format!("{}.rid", arg()))?,
                prompt: small(&prompt, "prompt")? as i64,
                gen: small(&gen, "gen")? as i64,
                produced: small(&produced, "produced")? as i64,
                stored_blocks: small(&stored, "stored_blocks")? as i64,
                context: int_named(&context, u64::MAX, || format!("{}.context", arg()))?,
            };
            batch.push((int_named(&node, u32::MAX as u64, || format!("{}.node", arg()))? as u32, join));
        }
        self.core.submit_decode_joins(&batch)?;
        Ok(batch.len())
    }

    /// What ended on decode node `node` since the last call: `([(rid, second_token_ns or -1)], [(gpu unit,
    /// start_ns, end_ns, batch size, step_ns)])` -- the requests in the order they ended, and the busy spans
    /// its GPUs closed.
    #[allow(clippy::type_complexity)]
    fn take_decoded(
        &mut self,
        node: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<(u64, i64)>, Vec<(u64, u64, u64, usize, u64)>)> {
        Ok(self.core.take_decoded(id_of(node, "node")?)?)
    }

    /// Decode node `node`'s engine crashed: every request it holds (decoding, waiting to join, ended but
    /// not yet taken) is dropped now, its wake-ups called off, its GPUs' busy spans closed and reported in a
    /// "decoded" completion; what it moved stays counted. Returns the number of requests dropped.
    fn decode_reset(&mut self, node: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self.core.decode_reset(id_of(node, "node")?)?)
    }

    /// The bytes decode node `node` moved on its own so far: `{"d2h": [(bytes, transfers)] per GPU, "a2a":
    /// [...] per GPU, "written": (bytes, writes)}`.
    fn decode_bytes<'py>(&self, py: Python<'py>, node: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let b = self.core.decode_bytes(id_of(node, "node")?)?;
        let d = PyDict::new(py);
        d.set_item("d2h", b.d2h.clone())?;
        d.set_item("a2a", b.a2a.clone())?;
        d.set_item("written", b.written)?;
        Ok(d)
    }

    /// Queue many storage I/Os: an iterable of `(node, "read" | "write", lane, size_bytes, tag[, extents])`,
    /// checked all before any is accepted; `extents`, `(context, first block, blocks)` runs, go with an I/O
    /// the core hands out (`set_external`).
    fn submit_ios(&mut self, ios: &Bound<'_, PyAny>) -> PyResult<usize> {
        let expected = "an iterable of (node, kind, lane, size_bytes, tag[, extents])";
        let items = ios.try_iter().map_err(|_| invalid("ios", expected))?;
        let mut batch = Vec::new();
        for (i, item) in items.enumerate() {
            let arg = || format!("ios[{i}]");
            let item = item?;
            let mut fields = items_named(&item, "", arg).map_err(|_| invalid(&arg(), expected))?;
            let extents = if fields.len() == 6 {
                let runs = fields.pop().expect("six fields");
                extents_of(&runs, &|| format!("{}.extents", arg()))?
            } else {
                Vec::new()
            };
            let [node, kind, lane, size, tag] = fields_named::<5>(
                &PyTuple::new(item.py(), fields)?.into_any(),
                "node, kind, lane, size_bytes, tag",
                arg,
            )?;
            let node = int_named(&node, u32::MAX as u64, || format!("{}.node", arg()))? as u32;
            let kind = match kind.extract::<&str>() {
                Ok("read") => IoKind::Read,
                Ok("write") => IoKind::Write,
                _ => return Err(invalid(&format!("{}.kind", arg()), "\"read\" or \"write\"")),
            };
            let lane = int_named(&lane, MAX_LANES as u64 - 1, || format!("{}.lane", arg()))? as u8;
            let size = int_named(&size, u64::MAX, || format!("{}.size_bytes", arg()))?;
            let tag = int_named(&tag, u64::MAX, || format!("{}.tag", arg()))?;
            batch.push((node, kind, lane, size, tag, extents));
        }
        let n = batch.len();
        self.core.submit_ios(batch)?;
        Ok(n)
    }

    /// Hand out, rather than model, the work a data plane moves itself (`external.rs`): a transfer whose
    /// path has ports of two domains (`port_domains[p]`, -1: none), every I/O of the storage nodes listed.
    /// Each such piece comes as an "external" completion (its tag the work's id); `take_external` says what
    /// it is, `complete_externals` when it ended.
    fn set_external(&mut self, port_domains: Vec<i64>, storage_nodes: Vec<u32>) -> PyResult<()> {
        let mut nodes = vec![false; storage_nodes.iter().map(|&n| n as usize + 1).max().unwrap_or(0)];
        for n in storage_nodes {
            nodes[n as usize] = true;
        }
        Ok(self.core.set_external(crate::ExternalRule { port_domains, storage_nodes: nodes })?)
    }

    /// The work handed out since the last call: `(id, kind, path, lane, size_bytes, storage node or -1,
    /// extents, start_ns)` each, `kind` "transfer", "read" or "write", `start_ns` when it was asked for.
    #[allow(clippy::type_complexity)]
    fn take_external(&mut self) -> Vec<(u64, &'static str, Vec<u32>, u8, u64, i64, Vec<(u64, u64, u64)>, u64)> {
        self.core
            .take_external()
            .into_iter()
            .map(|e| {
                let kind = match e.kind {
                    crate::ExternalKind::Transfer => "transfer",
                    crate::ExternalKind::Io(IoKind::Read) => "read",
                    crate::ExternalKind::Io(IoKind::Write) => "write",
                };
                let node = e.storage_node.map_or(-1, i64::from);
                (e.id, kind, e.path, e.lane, e.size_bytes, node, e.extents, e.start_ns)
            })
            .collect()
    }

    /// The transfers and storage I/Os kept so far (`record_spans`), in the order they ended: `(kind, path,
    /// storage node or -1, lane, size_bytes, start_ns, end_ns)`, `kind` "transfer", "read" or "write" (an
    /// I/O's path is its storage path).
    #[allow(clippy::type_complexity)]
    fn spans(&self) -> Vec<(&'static str, Vec<u32>, i64, u8, u64, u64, u64)> {
        self.core
            .spans()
            .into_iter()
            .map(|(kind, path, node, lane, size, start, end)| {
                (kind.as_str(), path, node.map_or(-1, i64::from), lane, size, start, end)
            })
            .collect()
    }

    /// External work `ids` ended now (each in flight, once; checked all first).
    fn complete_externals(&mut self, ids: Vec<u64>) -> PyResult<usize> {
        self.core.complete_externals(&ids)?;
        Ok(ids.len())
    }

    /// Start many forward passes now: an iterable of `(n_layers, ranks, ffn_ns, collectives, load_window,
    /// tag)`, each rank `(load, attn_ns, store)`, each load, store (or None) and collective
    /// `(path, lane, size_bytes)` per layer. The core expands each into its per-layer transfers and delays
    /// and reports one "forward" completion. All are checked before any is accepted.
    fn submit_forwards(&mut self, forwards: &Bound<'_, PyAny>) -> PyResult<usize> {
        let expected = "an iterable of (n_layers, ranks, ffn_ns, collectives, load_window, tag)";
        let items = forwards.try_iter().map_err(|_| invalid("forwards", expected))?;
        let mut batch = Vec::new();
        for (i, item) in items.enumerate() {
            batch.push(forward_of(&item?, i)?);
        }
        let n = batch.len();
        self.core.submit_forwards(batch)?;
        Ok(n)
    }

    /// A fault on `port` from now on: its rates × `factor` (1 as specified; in (0, 1) degraded; 0 down, the
    /// transfers crossing it stall, keeping what they moved, until it is up again).
    fn set_port_factor(&mut self, port: &Bound<'_, PyAny>, factor: &Bound<'_, PyAny>) -> PyResult<()> {
        let factor = number(factor, "factor")?;
        Ok(self.core.set_port_factor(id_of(port, "port")?, factor)?)
    }

    /// A fault on `port` from now on: `extra_ns` added to every transfer and storage I/O that starts crossing
    /// it (0 removes it; what is already moving is not held back).
    fn set_port_latency(&mut self, port: &Bound<'_, PyAny>, extra_ns: &Bound<'_, PyAny>) -> PyResult<()> {
        let extra = int_in(extra_ns, "extra_ns", u64::MAX)?;
        Ok(self.core.set_port_latency(id_of(port, "port")?, extra)?)
    }

    /// What a fault left of `port`'s rates: 1 when none, 0 when it is down.
    fn port_factor(&self, port: &Bound<'_, PyAny>) -> PyResult<f64> {
        Ok(self.core.port_factor(id_of(port, "port")?)?)
    }

    /// Timers: an iterable of `(at_ns, tag)`; each completes as a "timer" completion at `at_ns`.
    fn add_timers(&mut self, timers: &Bound<'_, PyAny>) -> PyResult<usize> {
        let items = timers.try_iter().map_err(|_| invalid("timers", "an iterable of (at_ns, tag)"))?;
        let mut batch = Vec::new();
        for (i, item) in items.enumerate() {
            let arg = format!("timers[{i}]");
            let [at, tag] = fields::<2>(&item?, &arg, "at_ns, tag")?;
            let at = int_in(&at, &format!("{arg}.at_ns"), u64::MAX)?;
            batch.push((at, int_in(&tag, &format!("{arg}.tag"), u64::MAX)?));
        }
        self.core.add_timers(&batch)?;
        Ok(batch.len())
    }

    #[getter]
    fn now_ns(&self) -> u64 {
        self.core.now_ns()
    }

    /// The clock's reading at this moment (wall mode: the scaled wall time), without handling any event.
    fn clock_ns(&self) -> u64 {
        self.core.clock_ns()
    }

    /// Core seconds per wall second for the wall clock; None for the virtual clock.
    #[getter]
    fn time_scale(&self) -> Option<f64> {
        self.core.time_scale()
    }

    /// Time of the next event, or None when nothing is pending.
    fn next_event_ns(&mut self) -> Option<u64> {
        self.core.next_event_ns()
    }

    /// Virtual clock: handle every event up to `t_ns`, move the clock there, return what completed as
    /// `(kind, tag, start_ns, end_ns, size_bytes, lane)` tuples in completion order.
    fn advance_to<'py>(&mut self, py: Python<'py>, t_ns: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let t = int_in(t_ns, "t_ns", u64::MAX)?;
        self.core.advance_to(t)?;
        completions_to_list(py, self.core.take_completions())
    }

    /// Virtual clock: handle events up to `t_ns` but stop after the first instant with completions (the
    /// clock ends there, or at `t_ns`); return what completed.
    fn advance_until<'py>(&mut self, py: Python<'py>, t_ns: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let t = int_in(t_ns, "t_ns", u64::MAX)?;
        self.core.advance_until(t)?;
        completions_to_list(py, self.core.take_completions())
    }

    /// Virtual clock: handle the next batch of simultaneous events. Returns `(t_ns, completions)`, or
    /// None when nothing is pending.
    fn step<'py>(&mut self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyList>)>> {
        match self.core.step()? {
            Some(t) => Ok(Some((t, completions_to_list(py, self.core.take_completions())?))),
            None => Ok(None),
        }
    }

    /// Virtual clock: run until nothing is pending; returns every completion.
    fn run_until_idle<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.core.run_until_idle()?;
        completions_to_list(py, self.core.take_completions())
    }

    /// Wall clock: handle what is due now and re-arm the wake-up descriptor; returns the completions.
    fn poll<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.core.poll()?;
        completions_to_list(py, self.core.take_completions())
    }

    /// Wall clock: a descriptor that becomes readable when the next event is due (for `add_reader`).
    fn wakeup_fd(&self) -> PyResult<i32> {
        Ok(self.core.wakeup_fd()?)
    }

    /// Completions handled but not yet returned (e.g. during submissions in wall-clock mode).
    fn take_completions<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        completions_to_list(py, self.core.take_completions())
    }

    /// Transfers, I/Os and timers submitted and not completed.
    fn pending(&self) -> u64 {
        self.core.pending()
    }

    /// A node's outstanding storage I/O (`read_q`): read/write bytes and requests, and I/Os in flight.
    fn storage_queue<'py>(&self, py: Python<'py>, node: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let q = self.core.storage_queue(id_of(node, "node")?)?;
        let d = PyDict::new(py);
        d.set_item("read_bytes", q.read_bytes)?;
        d.set_item("read_requests", q.read_requests)?;
        d.set_item("write_bytes", q.write_bytes)?;
        d.set_item("write_requests", q.write_requests)?;
        d.set_item("in_flight", q.in_flight)?;
        Ok(d)
    }

    /// A port's counters so far: `fluid_bytes` and `completed_bytes` per lane, `busy_s`.
    fn port_counters<'py>(&mut self, py: Python<'py>, port: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let k = self.core.port_counters(id_of(port, "port")?)?;
        let d = PyDict::new(py);
        d.set_item("fluid_bytes", k.fluid_bytes.to_vec())?;
        d.set_item("completed_bytes", k.completed_bytes.to_vec())?;
        d.set_item("busy_s", k.busy_s)?;
        Ok(d)
    }

    /// Utilisation of a port (fraction of its sustained rate) per sampling interval, for all lanes or one:
    /// one value per interval up to now. On a long run the interval is a power-of-two multiple of the one
    /// asked for (`sample_interval_ns` says which), so a series stays bounded.
    #[pyo3(signature = (port, lane = None))]
    fn utilisation(&mut self, port: &Bound<'_, PyAny>, lane: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<f64>> {
        let port = id_of(port, "port")?;
        let lane = lane.map(|l| lane_of(l, "lane")).transpose()?;
        Ok(self.core.utilisation(port, lane)?.1)
    }

    /// The utilisation sampling interval now (ns), or None if sampling is off: the one asked for, doubled as
    /// often as the run's length needed to keep every series within its bounded number of samples.
    #[getter]
    fn sample_interval_ns(&mut self) -> Option<u64> {
        Some(self.core.sample_interval_ns()).filter(|&ns| ns > 0)
    }

    /// Current rate of each lane through a port (bytes/s).
    fn lane_rates(&mut self, port: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
        Ok(self.core.lane_rates(id_of(port, "port")?)?.to_vec())
    }

    /// Current capacity of a port (its peak while its token bucket has tokens).
    fn capacity(&mut self, port: &Bound<'_, PyAny>) -> PyResult<f64> {
        Ok(self.core.capacity(id_of(port, "port")?)?)
    }

    /// Per-transfer rate of the transfers on `lane` along `path` now, or None if there are none.
    fn flow_rate(&mut self, path: &Bound<'_, PyAny>, lane: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
        let path = path_of(path, "path")?;
        Ok(self.core.flow_rate(&path, lane_of(lane, "lane")?))
    }

    /// Groups of transfers in flight: `(path, lane, transfers, per-transfer rate)`.
    fn in_flight(&mut self) -> Vec<(Vec<u32>, u8, usize, f64)> {
        self.core.in_flight()
    }

    /// Counters about the core's own work.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.stats();
        let d = PyDict::new(py);
        d.set_item("transfer_events", s.transfer_events)?;
        d.set_item("queue_events", s.queue_events)?;
        d.set_item("port_recomputes", s.net.port_recomputes)?;
        d.set_item("skipped_recomputes", s.net.skipped_recomputes)?;
        d.set_item("non_converged", s.net.non_converged)?;
        d.set_item("overload_repairs", s.net.overload_repairs)?;
        d.set_item("finished", s.net.finished)?;
        d.set_item("forwards", s.forwards.forwards)?;
        d.set_item("forward_transfers", s.forwards.transfers)?;
        d.set_item("forward_delays", s.forwards.delays)?;
        d.set_item("forward_instant_steps", s.forwards.instant_steps)?;
        d.set_item("spans_dropped", s.spans_dropped)?;
        Ok(d)
    }

    /// Per sampling interval before `until_ns`, the mean utilisation of `ports` (a time series).
    fn utilisation_mean(&mut self, ports: &Bound<'_, PyAny>, until_ns: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
        let ports = path_of(ports, "ports")?;
        Ok(self.core.utilisation_mean(&ports, int_in(until_ns, "until_ns", u64::MAX)?)?)
    }

    /// The `q`-quantile of the utilisation of `ports` over every sampling interval before `until_ns`.
    fn utilisation_quantile(
        &mut self,
        ports: &Bound<'_, PyAny>,
        q: &Bound<'_, PyAny>,
        until_ns: &Bound<'_, PyAny>,
    ) -> PyResult<f64> {
        let ports = path_of(ports, "ports")?;
        let q = number(q, "q")?;
        Ok(self.core.utilisation_quantile(&ports, q, int_in(until_ns, "until_ns", u64::MAX)?)?)
    }

    /// Write a Chrome/Perfetto trace (`{"traceEvents": [...]}`): port utilisation counters and, if
    /// recorded, every transfer and I/O as an async slice named by its path; `port_pids` (one per port)
    /// places each port's tracks in a process, `extra_events` (JSON object texts) are added as they are.
    #[pyo3(signature = (path, *, port_pids = None, extra_events = None))]
    fn write_trace(
        &mut self,
        path: &str,
        port_pids: Option<&Bound<'_, PyAny>>,
        extra_events: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let pids = port_pids.map(|p| path_of(p, "port_pids")).transpose()?;
        let mut extra = Vec::new();
        if let Some(events) = extra_events {
            let items = events.try_iter().map_err(|_| invalid("extra_events", "an iterable of str"))?;
            for (i, item) in items.enumerate() {
                let item = item?;
                let text: String = item.extract().map_err(|_| invalid(&format!("extra_events[{i}]"), "a str"))?;
                extra.push(text);
            }
        }
        Ok(self.core.write_trace(path, pids.as_deref(), &extra)?)
    }
}

/// The extension module, imported as `dualpath_emu._core`.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("UNREPORTED_TAG", crate::UNREPORTED_TAG)?;
    m.add_class::<PyCore>()?;
    m.add_class::<PyArbitration>()?;
    m.add_class::<PyPacketArbiter>()?;
    m.add_class::<PyPacketPort>()?;
    m.add("CoreError", py.get_type::<CoreError>())?;
    for (name, class) in ErrorClasses::get(py)?.named(py) {
        m.add(name, class)?;
    }
    Ok(())
}
