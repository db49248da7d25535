//! dualpath-emu core: owns time and every byte that moves.
//!
//! Ports (NIC sides, PCIe links, DRAM, storage) with token buckets and InfiniBand-style virtual lanes;
//! multi-hop transfers with exact completion times; a 3FS-like storage model; forward passes expanded
//! into per-layer transfers and compute delays; decode GPUs stepping their continuous batches; a virtual or wall clock and the event queue; counters;
//! and a chunk pacer with the same lanes for a backend that moves real bytes (`packet_port`). The Python
//! binding (feature `python`) is a thin batch-oriented layer.

pub mod bucket;
pub mod clock;
pub mod decode;
pub mod error;
pub mod events;
pub mod external;
pub mod forward;
pub mod lanes;
pub mod network;
pub mod packet_port;
pub mod sim;
pub mod storage;

pub use decode::{DecodeBytes, DecodeJoin, DecodeNodeSpec, DecodePricing};
pub use error::{CoreError, ErrorKind, Result};
pub use events::{TimeNs, END_NS};
pub use external::{External, ExternalKind, ExternalRule};
pub use forward::{ForwardRank, ForwardSpec, ForwardStats, LayerTransfer};
pub use lanes::{Lane, VlArbitration, MAX_LANES};
pub use network::{
    PortCounters, PortId, PortSpec, MAX_BURST_BYTES, MAX_RATE_BYTES_PER_S, MAX_SAMPLES_PER_SERIES,
    MIN_RATE_BYTES_PER_S, MIN_SAMPLES_PER_SERIES, SAMPLE_BUDGET,
};
pub use sim::{
    ClockMode, Completion, CompletionKind, Core, CoreConfig, CoreStats, MAX_SPANS, MAX_TIME_SCALE, MIN_TIME_SCALE,
    UNREPORTED_TAG,
};
pub use storage::{IoKind, NodeId, QueueState, StorageNodeSpec, StorageSpec};

#[cfg(feature = "python")]
mod python;
