//! How neighbouring stages hand each other activations (forward) and
//! gradients (backward): [`ChannelLink`] between threads of one process
//! (first-in first-out queues that never block the sender), and
//! [`CommLink`] between ranks through a [`Communicator`]'s `send`/`recv`,
//! so a pipeline spans processes and machines with the same schedule code.
//!
//! An activation travels with the random generator's state at the end of
//! the sending stage's forward, so the next stage continues the
//! micro-batch's random stream where the previous one stopped (see
//! [`PipelineRng`](super::PipelineRng)).
//!
//! A neighbour that failed or panicked drops its end: waiting on it is an
//! error at once; a neighbour that is only slow is an error after the
//! timeout.

use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use brasa_tensor::{DType, Device, GeneratorState, Tensor};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// What flows between stages: a micro-batch's tensor, plus the generator
/// state after the forward that made it (activations only).
pub(crate) struct Message {
    pub(crate) micro_batch: usize,
    pub(crate) tensor: Tensor,
    pub(crate) rng: Option<GeneratorState>,
}

/// One stage's connections to its neighbours.
pub(crate) trait Link {
    /// Sends the output of a forward to the next stage.
    fn send_forward(&self, message: Message) -> Result<()>;
    /// Receives the input of micro-batch `micro_batch` from the previous stage.
    fn recv_forward(&self, micro_batch: usize) -> Result<Message>;
    /// Sends the gradient of a stage's input to the previous stage.
    fn send_backward(&self, message: Message) -> Result<()>;
    /// Receives the gradient of the output of `micro_batch` from the next stage.
    fn recv_backward(&self, micro_batch: usize) -> Result<Message>;
    /// Whether sends complete only when the peer receives (so the order of
    /// sends and receives must match the peers': see the stage runner).
    fn rendezvous(&self) -> bool;
}

/// A stage's ends of the in-process queues to its neighbours.
pub(crate) struct ChannelLink {
    stage: usize,
    timeout: Duration,
    forward_in: Option<Receiver<Message>>,
    forward_out: Option<Sender<Message>>,
    backward_in: Option<Receiver<Message>>,
    backward_out: Option<Sender<Message>>,
}

impl ChannelLink {
    /// The links of `stages` stages in a chain, stage order.
    pub(crate) fn chain(stages: usize, timeout: Duration) -> Vec<ChannelLink> {
        let mut links: Vec<ChannelLink> = (0..stages)
            .map(|stage| ChannelLink {
                stage,
                timeout,
                forward_in: None,
                forward_out: None,
                backward_in: None,
                backward_out: None,
            })
            .collect();
        for s in 1..stages {
            let (forward_tx, forward_rx) = channel();
            let (backward_tx, backward_rx) = channel();
            links[s - 1].forward_out = Some(forward_tx);
            links[s - 1].backward_in = Some(backward_rx);
            links[s].forward_in = Some(forward_rx);
            links[s].backward_out = Some(backward_tx);
        }
        links
    }

    fn receive(
        &self,
        queue: &Option<Receiver<Message>>,
        peer: usize,
        what: &'static str,
        mb: usize,
    ) -> Result<Message> {
        let queue = queue.as_ref().ok_or_else(|| no_neighbour(self.stage, what))?;
        let message = queue.recv_timeout(self.timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => {
                ParallelError::Timeout { op: what, rank: self.stage, timeout: self.timeout, waiting_for: vec![peer] }
            }
            RecvTimeoutError::Disconnected => gone(what, self.stage, peer),
        })?;
        in_order(message, mb, what, self.stage)
    }
}

fn no_neighbour(stage: usize, what: &'static str) -> ParallelError {
    ParallelError::invalid(what, format!("stage {stage} has no neighbour in that direction"))
}

fn gone(what: &'static str, stage: usize, peer: usize) -> ParallelError {
    ParallelError::PeerFailed {
        op: what,
        rank: stage,
        peer,
        reason: "stopped (it failed or panicked; see its error)".into(),
    }
}

/// Queues are first-in first-out and both schedules go in micro-batch
/// order, so anything else is a bug worth naming.
fn in_order(message: Message, expected: usize, what: &'static str, stage: usize) -> Result<Message> {
    if message.micro_batch != expected {
        return Err(ParallelError::invalid(
            what,
            format!("stage {stage} expected micro-batch {expected} but received micro-batch {}", message.micro_batch),
        ));
    }
    Ok(message)
}

impl Link for ChannelLink {
    fn send_forward(&self, message: Message) -> Result<()> {
        const WHAT: &str = "pipeline send activation";
        let queue = self.forward_out.as_ref().ok_or_else(|| no_neighbour(self.stage, WHAT))?;
        queue.send(message).map_err(|_| gone(WHAT, self.stage, self.stage + 1))
    }

    fn recv_forward(&self, micro_batch: usize) -> Result<Message> {
        self.receive(&self.forward_in, self.stage.wrapping_sub(1), "pipeline recv activation", micro_batch)
    }

    fn send_backward(&self, message: Message) -> Result<()> {
        const WHAT: &str = "pipeline send gradient";
        let queue = self.backward_out.as_ref().ok_or_else(|| no_neighbour(self.stage, WHAT))?;
        queue.send(message).map_err(|_| gone(WHAT, self.stage, self.stage.wrapping_sub(1)))
    }

    fn recv_backward(&self, micro_batch: usize) -> Result<Message> {
        self.receive(&self.backward_in, self.stage + 1, "pipeline recv gradient", micro_batch)
    }

    fn rendezvous(&self) -> bool {
        false
    }
}

/// Slots of the header sent before each tensor between ranks.
const HEADER: usize = 16;
/// Dims a header can describe.
const MAX_DIMS: usize = HEADER - 8;

/// A rank's link to the ranks of its neighbouring stages: each message is
/// a header (micro-batch, dtype, shape, generator state, as f64 values,
/// exact below 2^53) and then the tensor, with the communicator's `send`
/// and `recv`.
pub(crate) struct CommLink {
    pub(crate) comm: Communicator,
    pub(crate) device: Device,
}

fn dtype_code(dtype: DType) -> f64 {
    const ALL: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
    ALL.iter().position(|d| *d == dtype).map_or(-1.0, |i| i as f64)
}

fn code_dtype(code: f64) -> Option<DType> {
    [DType::F32, DType::F64, DType::F16, DType::BF16].get(code as usize).copied().filter(|_| code >= 0.0)
}

impl CommLink {
    fn send(&self, message: Message, peer: usize, what: &'static str) -> Result<()> {
        let dims = message.tensor.dims();
        let code = dtype_code(message.tensor.dtype());
        if dims.len() > MAX_DIMS || code < 0.0 {
            return Err(ParallelError::invalid(
                what,
                format!(
                    "between ranks a pipeline sends float tensors of at most {MAX_DIMS} dims; got {:?} {}",
                    dims,
                    message.tensor.dtype()
                ),
            ));
        }
        let mut header = vec![0f64; HEADER];
        header[0] = message.micro_batch as f64;
        header[1] = code;
        header[2] = dims.len() as f64;
        if let Some(rng) = message.rng {
            header[3] = 1.0;
            header[4] = (rng.seed & 0xffff_ffff) as f64;
            header[5] = (rng.seed >> 32) as f64;
            header[6] = (rng.offset & 0xffff_ffff) as f64;
            header[7] = (rng.offset >> 32) as f64;
        }
        for (slot, &d) in header[8..].iter_mut().zip(dims) {
            *slot = d as f64;
        }
        let header = Tensor::from_vec_on(header, [HEADER], self.device)?;
        self.comm.send(&header, peer)?;
        let tensor = message.tensor.to(self.device)?.contiguous()?;
        self.comm.send(&tensor, peer)
    }

    fn recv(&self, peer: usize, expected: usize, what: &'static str) -> Result<Message> {
        let header = Tensor::zeros_on([HEADER], DType::F64, self.device)?;
        self.comm.recv(&header, peer)?;
        let h = header.to_vec::<f64>()?;
        let dtype = code_dtype(h[1]).ok_or_else(|| ParallelError::invalid(what, format!("bad dtype code {}", h[1])))?;
        let ndims = (h[2] as usize).min(MAX_DIMS);
        let dims: Vec<usize> = h[8..8 + ndims].iter().map(|&d| d as usize).collect();
        let rng = (h[3] == 1.0).then(|| GeneratorState {
            seed: h[4] as u64 | ((h[5] as u64) << 32),
            offset: h[6] as u64 | ((h[7] as u64) << 32),
        });
        let tensor = Tensor::zeros_on(dims, dtype, self.device)?;
        self.comm.recv(&tensor, peer)?;
        in_order(Message { micro_batch: h[0] as usize, tensor, rng }, expected, what, self.comm.rank())
    }
}

impl Link for CommLink {
    fn send_forward(&self, message: Message) -> Result<()> {
        self.send(message, self.comm.rank() + 1, "pipeline send activation")
    }

    fn recv_forward(&self, micro_batch: usize) -> Result<Message> {
        self.recv(self.comm.rank().wrapping_sub(1), micro_batch, "pipeline recv activation")
    }

    fn send_backward(&self, message: Message) -> Result<()> {
        self.send(message, self.comm.rank().wrapping_sub(1), "pipeline send gradient")
    }

    fn recv_backward(&self, micro_batch: usize) -> Result<Message> {
        self.recv(self.comm.rank() + 1, micro_batch, "pipeline recv gradient")
    }

    fn rendezvous(&self) -> bool {
        true
    }
}
