//! A 3FS-like storage cluster: an aggregate bandwidth shared by every node, a per-I/O latency, and per
//! node a FIFO read queue with a bounded number of I/Os in flight. Reads move bytes storage → the node's
//! storage NIC → its DRAM (every crossing is a port); writes go the other way. The queue a node's
//! actors see (`read_q`, paper §6) is what is outstanding: queued plus in flight, in bytes and requests.

use std::collections::VecDeque;

use crate::events::TimeNs;
use crate::lanes::Lane;
use crate::network::PortId;
use crate::{CoreError, Result};

/// The storage cluster as a whole.
#[derive(Clone, Debug)]
pub struct StorageSpec {
    /// Port carrying all reads out of the cluster (its rate is the aggregate read bandwidth).
    pub read_port: PortId,
    /// Port carrying all writes into the cluster (may be the same port as reads).
    pub write_port: PortId,
    /// Time from issuing an I/O to its first byte moving.
    pub read_latency_ns: TimeNs,
    pub write_latency_ns: TimeNs,
}

/// One node's attachment: the ports a read crosses after the cluster (e.g. SNIC receive side, DRAM),
/// the ports a write crosses before it (e.g. DRAM, SNIC transmit side), and its queue depth.
#[derive(Clone, Debug)]
pub struct StorageNodeSpec {
    pub name: String,
    pub read_path: Vec<PortId>,
    pub write_path: Vec<PortId>,
    /// I/Os in flight at once; later ones wait in FIFO order (the node's io_uring-like queue depth).
    pub queue_depth: u32,
}

/// Index of a storage node, in the order nodes were added.
pub type NodeId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
}

/// One storage I/O from issue to completion.
#[derive(Clone, Debug)]
pub struct Io {
    pub node: NodeId,
    pub kind: IoKind,
    pub lane: Lane,
    pub size_bytes: u64,
    pub tag: u64,
    pub issued_ns: TimeNs,
    /// The `(context, first block, blocks)` runs it moves, for a data plane that moves real bytes
    /// (`external.rs`); the model ignores them.
    pub extents: Vec<(u64, u64, u64)>,
}

/// Outstanding work of one node (what the scheduler reads as `read_q`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    pub read_bytes: u64,
    pub read_requests: u64,
    pub write_bytes: u64,
    pub write_requests: u64,
    /// I/Os past the queue (waiting out their latency or moving bytes).
    pub in_flight: u32,
}

struct Node {
    spec: StorageNodeSpec,
    waiting: VecDeque<u32>,
    state: QueueState,
}

/// The storage cluster's state: nodes, their queues, and the I/Os in progress (a slab with a free list,
/// so ids are small and reused deterministically).
pub struct Storage {
    pub spec: Option<StorageSpec>,
    nodes: Vec<Node>,
    ios: Vec<Option<Io>>,
    free: Vec<u32>,
}

impl Storage {
    pub fn new() -> Self {
        Self { spec: None, nodes: Vec::new(), ios: Vec::new(), free: Vec::new() }
    }

    pub fn configure(&mut self, spec: StorageSpec) -> Result<()> {
        if self.spec.is_some() {
            return Err(CoreError::state("the storage cluster is already configured"));
        }
        self.spec = Some(spec);
        Ok(())
    }

    pub fn add_node(&mut self, spec: StorageNodeSpec) -> Result<NodeId> {
        if self.spec.is_none() {
            return Err(CoreError::state("configure the storage cluster before adding nodes"));
        }
        if spec.queue_depth == 0 {
            return Err(CoreError::invalid("queue_depth", format!(">= 1 for storage node {:?}", spec.name)));
        }
        if self.nodes.iter().any(|n| n.spec.name == spec.name) {
            return Err(CoreError::invalid("name", format!("a new storage node name, {:?} already exists", spec.name)));
        }
        self.nodes.push(Node { spec, waiting: VecDeque::new(), state: QueueState::default() });
        Ok((self.nodes.len() - 1) as NodeId)
    }

    pub fn node_id(&self, name: &str) -> Result<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.spec.name == name)
            .map(|i| i as NodeId)
            .ok_or_else(|| CoreError::unknown("storage node", format!("{name:?}")))
    }

    /// The name a storage node was added with.
    pub fn node_name(&self, node: NodeId) -> Option<&str> {
        self.nodes.get(node as usize).map(|n| n.spec.name.as_str())
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn queue(&self, node: NodeId) -> Result<QueueState> {
        self.nodes.get(node as usize).map(|n| n.state).ok_or_else(|| CoreError::unknown("storage node", node))
    }

    /// The full path an I/O's bytes take.
    pub fn path(&self, io: &Io) -> Vec<PortId> {
        let spec = self.spec.as_ref().expect("configured before any I/O");
        let node = &self.nodes[io.node as usize].spec;
        match io.kind {
            IoKind::Read => std::iter::once(spec.read_port).chain(node.read_path.iter().copied()).collect(),
            IoKind::Write => node.write_path.iter().copied().chain(std::iter::once(spec.write_port)).collect(),
        }
    }

    pub fn latency_ns(&self, kind: IoKind) -> TimeNs {
        let spec = self.spec.as_ref().expect("configured before any I/O");
        match kind {
            IoKind::Read => spec.read_latency_ns,
            IoKind::Write => spec.write_latency_ns,
        }
    }

    /// Queue an I/O; returns the ids that may start now (at most one: this one, if the node has room).
    pub fn submit(&mut self, io: Io) -> Result<Option<u32>> {
        let node = self.nodes.get_mut(io.node as usize).ok_or_else(|| CoreError::unknown("storage node", io.node))?;
        match io.kind {
            IoKind::Read => {
                node.state.read_bytes += io.size_bytes;
                node.state.read_requests += 1;
            }
            IoKind::Write => {
                node.state.write_bytes += io.size_bytes;
                node.state.write_requests += 1;
            }
        }
        let node_id = io.node as usize;
        let id = match self.free.pop() {
            Some(id) => {
                self.ios[id as usize] = Some(io);
                id
            }
            None => {
                self.ios.push(Some(io));
                (self.ios.len() - 1) as u32
            }
        };
        let node = &mut self.nodes[node_id];
        if node.state.in_flight < node.spec.queue_depth {
            node.state.in_flight += 1;
            Ok(Some(id))
        } else {
            node.waiting.push_back(id);
            Ok(None)
        }
    }

    pub fn io(&self, id: u32) -> &Io {
        self.ios[id as usize].as_ref().expect("live I/O id")
    }

    /// An I/O has finished: free its slot and return it, with the next waiting I/O of its node to start.
    pub fn finish(&mut self, id: u32) -> (Io, Option<u32>) {
        let io = self.ios[id as usize].take().expect("live I/O id");
        self.free.push(id);
        let node = &mut self.nodes[io.node as usize];
        match io.kind {
            IoKind::Read => {
                node.state.read_bytes -= io.size_bytes;
                node.state.read_requests -= 1;
            }
            IoKind::Write => {
                node.state.write_bytes -= io.size_bytes;
                node.state.write_requests -= 1;
            }
        }
        let next = node.waiting.pop_front();
        if next.is_none() {
            node.state.in_flight -= 1;
        }
        (io, next)
    }
}

impl Default for Storage {
    fn default() -> Self {
        Self::new()
    }
}
