//! The one error type of the core. Every fallible public function returns [`CoreError`]; the Python
//! binding converts it to the matching class under `dualpath_emu.errors` in one place (`python.rs`).
//! A panic in the core is a bug, never a way to report bad input.

use std::fmt;

/// What kind of mistake an error reports; each maps to one Python exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// An argument has a bad value (negative or zero rate, empty path, lane out of range…).
    InvalidArgument,
    /// A port, node or transfer id or name that does not exist.
    Unknown,
    /// An arbitration table or other configuration that cannot be honoured.
    Config,
    /// The operation is not allowed in the core's current state (e.g. advancing a wall clock by hand).
    State,
    /// Reading or writing a file failed.
    Io,
}

/// An error with the name of the offending argument and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CoreError {
    pub fn invalid(arg: &str, expected: impl fmt::Display) -> Self {
        Self { kind: ErrorKind::InvalidArgument, message: format!("{arg}: {expected}") }
    }
    pub fn unknown(what: &str, which: impl fmt::Display) -> Self {
        Self { kind: ErrorKind::Unknown, message: format!("unknown {what}: {which}") }
    }
    pub fn config(key: &str, expected: impl fmt::Display) -> Self {
        Self { kind: ErrorKind::Config, message: format!("{key}: {expected}") }
    }
    pub fn state(message: impl fmt::Display) -> Self {
        Self { kind: ErrorKind::State, message: message.to_string() }
    }
    /// The same error about a part of a larger argument: `path: ...` becomes `transfers[3].path: ...`.
    pub fn within(self, outer: &str) -> Self {
        Self { kind: self.kind, message: format!("{outer}.{}", self.message) }
    }

    pub fn io(path: &str, err: impl fmt::Display) -> Self {
        Self { kind: ErrorKind::Io, message: format!("{path}: {err}") }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CoreError {}

pub type Result<T> = std::result::Result<T, CoreError>;
