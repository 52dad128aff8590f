//! What a rank asks its group to do: a [`Collective`] (or point-to-point
//! transfer) on tensors, and the [`Signature`] ranks compare before they
//! exchange a byte, so that ranks calling different collectives, or with
//! different sizes or dtypes, get an error naming both sides.

use crate::error::{ParallelError, Result};
use brasa_tensor::{DType, Tensor};

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean over ranks (the sum divided by the world size).
    Avg,
    /// Elementwise maximum (NaN wins, as in PyTorch).
    Max,
    /// Elementwise minimum (NaN wins).
    Min,
}

impl ReduceOp {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// One operation submitted to a communicator. Tensors are handles to the
/// caller's storage: the communicator works in place, without copies
/// beyond what the algorithm needs.
#[derive(Clone, Debug)]
pub enum Collective {
    /// Every rank's `tensor` becomes the reduction of all ranks' `tensor`.
    AllReduce {
        /// Input and output, in place.
        tensor: Tensor,
        /// The reduction.
        op: ReduceOp,
    },
    /// Every rank's `tensor` becomes `root`'s.
    Broadcast {
        /// Root's input, everyone else's output.
        tensor: Tensor,
        /// The rank whose values are sent.
        root: usize,
    },
    /// `output` (world × `input`'s elements) becomes every rank's `input`,
    /// in rank order. `input` may be rank's own slice of `output` (in place).
    AllGather {
        /// This rank's contribution.
        input: Tensor,
        /// All contributions, concatenated by rank.
        output: Tensor,
    },
    /// `output` becomes the reduction over ranks of slice `rank` of `input`
    /// (`input` holds world × `output`'s elements).
    ReduceScatter {
        /// world slices, one per rank.
        input: Tensor,
        /// This rank's reduced slice.
        output: Tensor,
        /// The reduction.
        op: ReduceOp,
    },
    /// Sends `tensor` to rank `peer`, which receives it with a matching `Recv`.
    Send {
        /// What is sent.
        tensor: Tensor,
        /// The receiving rank.
        peer: usize,
    },
    /// Receives into `tensor` what rank `peer` sends.
    Recv {
        /// Where it lands.
        tensor: Tensor,
        /// The sending rank.
        peer: usize,
    },
    /// Returns once every rank reached it.
    Barrier,
}

/// What ranks must agree on before a collective runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The collective's name.
    pub op: &'static str,
    /// The element type (`None` for a barrier).
    pub dtype: Option<DType>,
    /// Elements each rank contributes.
    pub numel: usize,
    /// The reduction, for reducing collectives.
    pub reduce: Option<ReduceOp>,
    /// The root of a broadcast.
    pub root: Option<usize>,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(dtype) = self.dtype {
            write!(f, " of {} {dtype} elements", self.numel)?;
        }
        if let Some(reduce) = self.reduce {
            write!(f, " ({})", reduce.name())?;
        }
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        Ok(())
    }
}

impl Collective {
    /// The tensors it reads or writes.
    pub fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Collective::AllReduce { tensor, .. }
            | Collective::Broadcast { tensor, .. }
            | Collective::Send { tensor, .. }
            | Collective::Recv { tensor, .. } => vec![tensor],
            Collective::AllGather { input, output } | Collective::ReduceScatter { input, output, .. } => {
                vec![input, output]
            }
            Collective::Barrier => vec![],
        }
    }

    /// The collective's name (`all_reduce`, `broadcast`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "all_reduce",
            Collective::Broadcast { .. } => "broadcast",
            Collective::AllGather { .. } => "all_gather",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::Send { .. } => "send",
            Collective::Recv { .. } => "recv",
            Collective::Barrier => "barrier",
        }
    }

    /// Bytes this rank contributes (what a profiler range shows).
    pub fn bytes(&self) -> usize {
        match self {
            Collective::AllReduce { tensor, .. }
            | Collective::Broadcast { tensor, .. }
            | Collective::Send { tensor, .. }
            | Collective::Recv { tensor, .. } => tensor.numel() * tensor.dtype().size_in_bytes(),
            Collective::AllGather { output, .. } => output.numel() * output.dtype().size_in_bytes(),
            Collective::ReduceScatter { input, .. } => input.numel() * input.dtype().size_in_bytes(),
            Collective::Barrier => 0,
        }
    }

    /// The signature ranks compare (point-to-point ops compare sender and
    /// receiver in the same way).
    pub fn signature(&self) -> Signature {
        let (dtype, numel, reduce, root) = match self {
            Collective::AllReduce { tensor, op } => (Some(tensor.dtype()), tensor.numel(), Some(*op), None),
            Collective::Broadcast { tensor, root } => (Some(tensor.dtype()), tensor.numel(), None, Some(*root)),
            Collective::AllGather { input, .. } => (Some(input.dtype()), input.numel(), None, None),
            Collective::ReduceScatter { output, op, .. } => (Some(output.dtype()), output.numel(), Some(*op), None),
            Collective::Send { tensor, .. } | Collective::Recv { tensor, .. } => {
                (Some(tensor.dtype()), tensor.numel(), None, None)
            }
            Collective::Barrier => (None, 0, None, None),
        };
        // Send and recv pair with each other: compare them as one kind.
        let op = match self {
            Collective::Send { .. } | Collective::Recv { .. } => "send/recv",
            other => other.name(),
        };
        Signature { op, dtype, numel, reduce, root }
    }

    /// Checks what one rank can check alone: dtypes, contiguity, devices,
    /// sizes of outputs, roots and peers in range.
    pub fn validate(&self, rank: usize, world: usize) -> Result<()> {
        let op = self.name();
        // Reductions need float arithmetic; copies move any dtype.
        let reduces = matches!(self, Collective::AllReduce { .. } | Collective::ReduceScatter { .. });
        let check_tensor = |t: &Tensor, what: &str| -> Result<()> {
            if reduces && !t.dtype().is_float() {
                return Err(ParallelError::invalid(
                    op,
                    format!("{what} has dtype {}; reductions take float tensors (f32, f64, f16, bf16)", t.dtype()),
                ));
            }
            if !t.is_contiguous() {
                return Err(ParallelError::invalid(
                    op,
                    format!("{what} (shape {:?}) is not contiguous; call .contiguous() first", t.dims()),
                ));
            }
            Ok(())
        };
        let check_rank = |r: usize, what: &str| -> Result<()> {
            if r >= world {
                return Err(ParallelError::invalid(op, format!("{what} {r} is not a rank of a world of {world}")));
            }
            Ok(())
        };
        match self {
            Collective::AllReduce { tensor, .. } => check_tensor(tensor, "the tensor"),
            Collective::Broadcast { tensor, root } => {
                check_tensor(tensor, "the tensor")?;
                check_rank(*root, "root")
            }
            Collective::AllGather { input, output } => {
                check_tensor(input, "the input")?;
                check_tensor(output, "the output")?;
                same_kind(op, input, output)?;
                if output.numel() != input.numel() * world {
                    return Err(ParallelError::invalid(
                        op,
                        format!(
                            "the output holds {} elements; it must hold world size {world} x input {} = {}",
                            output.numel(),
                            input.numel(),
                            input.numel() * world
                        ),
                    ));
                }
                Ok(())
            }
            Collective::ReduceScatter { input, output, .. } => {
                check_tensor(input, "the input")?;
                check_tensor(output, "the output")?;
                same_kind(op, input, output)?;
                if input.numel() != output.numel() * world {
                    return Err(ParallelError::invalid(
                        op,
                        format!(
                            "the input holds {} elements; it must hold world size {world} x output {} = {}",
                            input.numel(),
                            output.numel(),
                            output.numel() * world
                        ),
                    ));
                }
                if input.shares_storage_with(output) {
                    return Err(ParallelError::invalid(op, "the output must not share storage with the input"));
                }
                Ok(())
            }
            Collective::Send { tensor, peer } | Collective::Recv { tensor, peer } => {
                check_tensor(tensor, "the tensor")?;
                check_rank(*peer, "peer")?;
                if *peer == rank {
                    return Err(ParallelError::invalid(op, format!("rank {rank} cannot {op} to or from itself")));
                }
                Ok(())
            }
            Collective::Barrier => Ok(()),
        }
    }
}

fn same_kind(op: &'static str, input: &Tensor, output: &Tensor) -> Result<()> {
    if input.dtype() != output.dtype() {
        return Err(ParallelError::invalid(
            op,
            format!("input is {} but output is {}; they must have one dtype", input.dtype(), output.dtype()),
        ));
    }
    if input.device() != output.device() {
        return Err(ParallelError::invalid(
            op,
            format!("input is on {} but output on {}; they must be on one device", input.device(), output.device()),
        ));
    }
    Ok(())
}
