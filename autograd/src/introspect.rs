//! Live-graph introspection: how many operation nodes are alive and how many
//! bytes their saved tensors hold, process-wide and for the graph behind one
//! `Var`. A graph kept alive by mistake (a running loss summed as a `Var`
//! instead of `item()`) shows up here before it shows up as out-of-memory.

use crate::graph::{live_node_count, reachable, reachable_through_recomputation, Node, NodeKind};
use crate::saved::saved_byte_count;
use crate::var::Var;
use std::collections::HashSet;

/// Operation nodes alive in this process (all threads).
pub fn live_nodes() -> usize {
    live_node_count()
}

/// Bytes of the distinct storages that saved tensors hold in this process.
/// A tensor that saved-tensor hooks packed ([`crate::save_on_host`]) is not
/// held by the graph: what its hooks keep is theirs to account for.
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

/// For each of `leaves`, whether a backward from `outputs` would reach it
/// (give it a gradient), counting the leaves a checkpointed function uses
/// (its recomputation in backward gives them gradients). Data-parallel training asks this after forward to
/// find parameters the step does not use, which would otherwise leave their
/// gradient all-reduce waiting forever.
pub fn leaves_reached(outputs: &[&Var], leaves: &[Var]) -> Vec<bool> {
    let roots: Vec<_> = outputs.iter().filter_map(|v| v.0.grad_fn.clone()).collect();
    // Through checkpoints too: their recomputation gives gradients to the
    // parameters their function used, though the graph has no edge to them.
    let reached: HashSet<usize> = reachable_through_recomputation(&roots).iter().map(Node::key).collect();
    leaves
        .iter()
        .map(|leaf| {
            // An output that is itself the leaf reaches it (its gradient is 1).
            let is_output = outputs.iter().any(|o| o.same_var(leaf) && leaf.requires_grad());
            is_output || leaf.0.accumulator.get().is_some_and(|node| reached.contains(&Node::key(node)))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::{DType, Tensor};

    #[test]
    fn leaves_reached_finds_what_backward_would_reach() -> crate::Result<()> {
        let used = Var::param(Tensor::ones([2], DType::F32)?)?;
        let unused = Var::param(Tensor::ones([2], DType::F32)?)?;
        let frozen = Var::new(Tensor::ones([2], DType::F32)?);
        let y = used.mul(&frozen)?.sum_all()?;
        assert_eq!(leaves_reached(&[&y], &[used.clone(), unused.clone(), frozen]), [true, false, false]);
        assert_eq!(leaves_reached(&[&used], &[used.clone(), unused]), [true, false]);
        Ok(())
    }
}
