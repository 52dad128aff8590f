//! Live-graph introspection: how many operation nodes are alive and how many
//! bytes their saved tensors hold, process-wide and for the graph behind one
//! `Var`. A graph kept alive by mistake (a running loss summed as a `Var`
//! instead of `item()`) shows up here before it shows up as out-of-memory.

use crate::graph::{live_node_count, reachable, saved_byte_count, NodeKind};
use crate::var::Var;
use std::collections::HashSet;

/// Operation nodes alive in this process (all threads).
pub fn live_nodes() -> usize {
    live_node_count()
}

/// Bytes of the distinct storages that saved tensors hold in this process.
pub fn saved_tensor_bytes() -> usize {
    saved_byte_count()
}

/// The graph behind one `Var`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Operation nodes reachable from the `Var`.
    pub nodes: usize,
    /// Of those, nodes whose saved tensors were already released.
    pub released: usize,
    /// Bytes of distinct storages their saved tensors hold.
    pub saved_bytes: usize,
}

impl Var {
    /// Nodes and saved bytes of the graph that produced this `Var`.
    pub fn graph_stats(&self) -> GraphStats {
        let Some(root) = self.0.grad_fn.clone() else { return GraphStats::default() };
        let mut stats = GraphStats::default();
        let mut storages = HashSet::new();
        for node in reachable(&[root]) {
            if let NodeKind::Op(slot) = &node.kind {
                stats.nodes += 1;
                if crate::graph::lock(slot).is_none() {
                    stats.released += 1;
                }
                for (key, bytes) in node.saved_storages() {
                    if storages.insert(key) {
                        stats.saved_bytes += bytes;
                    }
                }
            }
        }
        stats
    }
}
