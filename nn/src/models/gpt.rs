//! [`Gpt`]: a decoder-only transformer language model, nanoGPT's `GPT`
//! (Karpathy's minimal GPT-2): token and position embeddings, `n_layer`
//! pre-norm causal blocks, a final layer norm, and an output projection
//! tied to the token embedding.
//!
//! ```text
//! x = dropout(wte[ids] + wpe[0..T])
//! for each block:  x = x + dropout(attn(ln_1(x), causal))       (MultiheadAttention)
//!                  x = x + dropout(proj(gelu(fc(ln_2(x)))))      (4× wide MLP)
//! logits = ln_f(x) · wteᵀ                                        (weight tying)
//! ```
//!
//! The attention is [`MultiheadAttention`] with the causal mask, so it runs
//! on [`crate::functional::scaled_dot_product_attention`] (the fused
//! implementation of the device). Dropout applies to the embeddings, the
//! attention weights and both residual branches, as in nanoGPT. The
//! weights are initialised as nanoGPT does, from a seeded local generator
//! (`N(0, 0.02)`; the residual projections `N(0, 0.02/√(2·n_layer))`;
//! biases zero), so a model is the same for a seed whatever else draws
//! from the process-wide generator. With [`GptConfig::checkpoint`] every
//! block is an activation checkpoint ([`brasa_autograd::checkpoint`]): it
//! keeps only its input for backward and runs again during backward.
//! [`Gpt::generate`] samples text with a temperature and top-k.
//! [`Gpt::into_units`] turns the model into a [`Sequential`] of units
//! ([`GptEmbedding`], the blocks, [`GptHead`], the tied table shared by the
//! first and the last) with the same logits, the shape fully sharded data
//! parallelism shards unit by unit.
//!
//! ```
//! use brasa_nn::models::{Gpt, GptConfig, SampleOptions};
//! use brasa_nn::optim::{AdamConfig, AdamW, Optimizer};
//! use brasa_nn::ModuleExt;
//! use brasa_tensor::{Device, Tensor};
//!
//! let config = GptConfig::new(16, 8, 2, 2, 32); // vocab 16, context 8, 2 layers, 2 heads, 32 wide
//! let mut model = Gpt::new(config, Device::CPU)?;
//! let mut opt = AdamW::new(model.parameters(), AdamConfig::adamw())?;
//! let ids = Tensor::from_vec((0..16).map(|i| i % 16).collect::<Vec<i64>>(), [2, 8])?;
//! let targets = Tensor::from_vec((1..17).map(|i| i % 16).collect::<Vec<i64>>(), [2, 8])?;
//! assert_eq!(model.logits(&ids)?.dims(), &[2, 8, 16]);
//! let loss = model.loss(&ids, &targets)?;
//! loss.backward()?;
//! opt.step()?;
//! let text = model.generate(&[0], 20, &SampleOptions::new().temperature(0.8).top_k(5).seed(1))?;
//! assert_eq!(text.len(), 21); // the prompt and 20 new tokens
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use crate::functional::cross_entropy;
use crate::layers::Sequential;
use crate::layers::{
    AttentionMasks, Dropout, Embedding, LayerNorm, LayerNormConfig, Linear, MultiheadAttention,
    MultiheadAttentionConfig,
};
use crate::module::{Module, ModuleExt};
use crate::state_dict::{LoadReport, StateDict};
use brasa_autograd::{checkpoint, is_grad_enabled, no_grad, AutogradError, Var};
use brasa_tensor::{DType, Device, Generator, SharedError, Tensor, TensorError};

/// The shape and training options of a [`Gpt`]. [`GptConfig::new`] gives
/// nanoGPT's `train.py` defaults for the rest: no dropout, no biases in the
/// linear layers and norms, no checkpointing, f32, initialisation seed 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// The number of tokens (the embedding's rows, the logits' width).
    pub vocab_size: usize,
    /// The longest context (the position embedding's rows).
    pub block_size: usize,
    /// The number of transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block (they must divide `n_embd`).
    pub n_head: usize,
    /// The model width.
    pub n_embd: usize,
    /// The dropout probability (embeddings, attention weights, residual branches).
    pub dropout: f64,
    /// Whether the linear layers and layer norms have biases.
    pub bias: bool,
    /// Whether every block is an activation checkpoint while training.
    pub checkpoint: bool,
    /// The seed of the initial weights.
    pub init_seed: u64,
    /// The dtype of the parameters.
    pub dtype: DType,
}

impl GptConfig {
    /// A model of this shape with the defaults above.
    pub fn new(vocab_size: usize, block_size: usize, n_layer: usize, n_head: usize, n_embd: usize) -> GptConfig {
        GptConfig {
            vocab_size,
            block_size,
            n_layer,
            n_head,
            n_embd,
            dropout: 0.0,
            bias: false,
            checkpoint: false,
            init_seed: 0,
            dtype: DType::F32,
        }
    }

    /// GPT-2 small (OpenAI's 124M model): a 50,257-token vocabulary, a
    /// context of 1,024, 12 layers of 12 heads, 768 wide, with biases and
    /// no dropout (124,439,808 parameters: the head shares the token table).
    pub fn gpt2() -> GptConfig {
        GptConfig::new(50257, 1024, 12, 12, 768).bias(true)
    }

    /// nanoGPT's `shakespeare_char` configuration for a GPU: 6 layers, 6
    /// heads, 384 wide, a context of 256, dropout 0.2 (about 10.7 M
    /// parameters; validation loss about 1.47 on Tiny Shakespeare).
    pub fn shakespeare_char(vocab_size: usize) -> GptConfig {
        GptConfig::new(vocab_size, 256, 6, 6, 384).dropout(0.2)
    }

    /// nanoGPT's configuration for a CPU (its README): 4 layers, 4 heads,
    /// 128 wide, a context of 64, no dropout (about 0.8 M parameters;
    /// validation loss about 1.88 after 2,000 steps of batch 12).
    pub fn shakespeare_char_cpu(vocab_size: usize) -> GptConfig {
        GptConfig::new(vocab_size, 64, 4, 4, 128)
    }

    /// With this dropout probability.
    pub fn dropout(self, dropout: f64) -> GptConfig {
        GptConfig { dropout, ..self }
    }

    /// With or without biases.
    pub fn bias(self, bias: bool) -> GptConfig {
        GptConfig { bias, ..self }
    }

    /// With or without a checkpoint per block.
    pub fn checkpoint(self, checkpoint: bool) -> GptConfig {
        GptConfig { checkpoint, ..self }
    }

    /// With initial weights drawn from this seed.
    pub fn init_seed(self, init_seed: u64) -> GptConfig {
        GptConfig { init_seed, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> GptConfig {
        GptConfig { dtype, ..self }
    }

    /// Errors naming the first invalid value.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return Err(NnError::invalid("GptConfig", format!("{name} must be positive, got 0")));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(NnError::invalid(
                "GptConfig",
                format!("n_head ({}) must divide n_embd ({})", self.n_head, self.n_embd),
            ));
        }
        if !(0.0..=1.0).contains(&self.dropout) {
            return Err(NnError::invalid("GptConfig", format!("dropout must be in [0, 1], got {}", self.dropout)));
        }
        if !self.dtype.is_float() {
            return Err(NnError::invalid(
                "GptConfig",
                format!("parameters must be floating point, got {}", self.dtype),
            ));
        }
        Ok(())
    }
}

/// One pre-norm causal transformer block of a [`Gpt`] on `[N, T, E]`:
/// `x + dropout(attn(ln_1(x)))`, then `x + dropout(mlp_proj(gelu(mlp_fc(ln_2(x)))))`.
/// Cloning gives a handle on the same parameters (what a checkpoint keeps
/// to run the block again).
#[derive(crate::Parameters, Clone)]
pub struct GptBlock {
    /// The norm before the attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention (batch first, dropout on the attention weights).
    pub attn: MultiheadAttention,
    /// The norm before the MLP.
    pub ln_2: LayerNorm,
    /// `E → 4E`.
    pub mlp_fc: Linear,
    /// `4E → E`.
    pub mlp_proj: Linear,
    /// Dropout on each residual branch.
    pub resid_dropout: Dropout,
}

impl GptBlock {
    /// A block of `config`'s width, initialised as nanoGPT does from `generator`.
    pub fn new(config: &GptConfig, generator: &mut Generator, device: Device) -> Result<GptBlock> {
        config.validate()?;
        let (e, dtype) = (config.n_embd, config.dtype);
        let proj_std = 0.02 / (2.0 * config.n_layer as f64).sqrt();
        let norm = LayerNormConfig::new().bias(config.bias).dtype(dtype);
        let attention =
            MultiheadAttentionConfig::new().dropout(config.dropout).bias(config.bias).batch_first(true).dtype(dtype);
        let mut attn = MultiheadAttention::with_config(e, config.n_head, attention, device)?;
        attn.in_proj_weight = normal_param(generator, &[3 * e, e], 0.02, dtype, device)?;
        attn.out_proj.weight = normal_param(generator, &[e, e], proj_std, dtype, device)?;
        Ok(GptBlock {
            ln_1: LayerNorm::with_config([e], norm, device)?,
            attn,
            ln_2: LayerNorm::with_config([e], norm, device)?,
            mlp_fc: linear(generator, e, 4 * e, 0.02, config, device)?,
            mlp_proj: linear(generator, 4 * e, e, proj_std, config, device)?,
            resid_dropout: Dropout::new(config.dropout)?,
        })
    }
}

impl Module for GptBlock {
    fn forward(&self, x: &Var) -> Result<Var> {
        let h = self.ln_1.forward(x)?;
        let attended = self.attn.attend(&h, &h, &h, &AttentionMasks::new().causal(true))?;
        let x = x.add(&self.resid_dropout.forward(&attended)?)?;
        let hidden = self.mlp_fc.forward(&self.ln_2.forward(&x)?)?.gelu()?;
        Ok(x.add(&self.resid_dropout.forward(&self.mlp_proj.forward(&hidden)?)?)?)
    }
}

/// How [`Gpt::generate`] samples: logits divided by `temperature`, only the
/// `top_k` most likely tokens kept (all when `None`), draws from a
/// generator seeded with `seed`. The default is temperature 1, no top-k,
/// seed 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleOptions {
    /// Divides the logits: below 1 sharper, above 1 flatter (positive, finite).
    pub temperature: f64,
    /// Keep only the `k` largest logits (at least 1; more than the vocabulary keeps all).
    pub top_k: Option<usize>,
    /// The seed of the draws: the same seed and model give the same text.
    pub seed: u64,
}

impl Default for SampleOptions {
    fn default() -> SampleOptions {
        SampleOptions { temperature: 1.0, top_k: None, seed: 0 }
    }
}

impl SampleOptions {
    /// Temperature 1, no top-k, seed 0.
    pub fn new() -> SampleOptions {
        SampleOptions::default()
    }

    /// With this temperature.
    pub fn temperature(self, temperature: f64) -> SampleOptions {
        SampleOptions { temperature, ..self }
    }

    /// Keeping only the `k` most likely tokens.
    pub fn top_k(self, k: usize) -> SampleOptions {
        SampleOptions { top_k: Some(k), ..self }
    }

    /// With draws from this seed.
    pub fn seed(self, seed: u64) -> SampleOptions {
        SampleOptions { seed, ..self }
    }

    fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(NnError::invalid(
                "Gpt::generate",
                format!("temperature must be positive and finite, got {}", self.temperature),
            ));
        }
        if self.top_k == Some(0) {
            return Err(NnError::invalid("Gpt::generate", "top_k must be at least 1, got 0"));
        }
        Ok(())
    }
}

/// A decoder-only transformer language model (see the module docs).
/// Parameter names follow nanoGPT's where they can (`wte.weight`,
/// `wpe.weight`, `blocks.0.ln_1.weight`, `blocks.0.attn.in_proj_weight`,
/// `ln_f.weight`); there is no `lm_head.weight`: the head is `wte.weight`.
#[derive(crate::Parameters)]
pub struct Gpt {
    /// Token embedding `[vocab_size, n_embd]`, also the output projection.
    pub wte: Embedding,
    /// Position embedding `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// Dropout on the summed embeddings.
    pub drop: Dropout,
    /// The transformer blocks.
    pub blocks: Vec<GptBlock>,
    /// The final norm.
    pub ln_f: LayerNorm,
    #[module(skip)]
    config: GptConfig,
}

impl Gpt {
    /// A model built and initialised as `config` says, on `device`.
    pub fn new(config: GptConfig, device: Device) -> Result<Gpt> {
        config.validate()?;
        let (e, dtype) = (config.n_embd, config.dtype);
        let mut generator = Generator::new(config.init_seed);
        let wte = normal(&mut generator, &[config.vocab_size, e], 0.02, dtype, device)?;
        let wpe = normal(&mut generator, &[config.block_size, e], 0.02, dtype, device)?;
        let blocks =
            (0..config.n_layer).map(|_| GptBlock::new(&config, &mut generator, device)).collect::<Result<_>>()?;
        Ok(Gpt {
            wte: Embedding::from_pretrained(wte, false)?,
            wpe: Embedding::from_pretrained(wpe, false)?,
            drop: Dropout::new(config.dropout)?,
            blocks,
            ln_f: LayerNorm::with_config([e], LayerNormConfig::new().bias(config.bias).dtype(dtype), device)?,
            config,
        })
    }

    /// The configuration it was built with (and the current checkpointing).
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Turns the per-block activation checkpoints on or off.
    pub fn set_checkpoint(&mut self, checkpoint: bool) {
        self.config.checkpoint = checkpoint;
    }

    /// The logits `[N, T, vocab_size]` of the next token after each prefix
    /// of `ids` (`[N, T]` `i64`, `1 ≤ T ≤ block_size`).
    pub fn logits(&self, ids: &Tensor) -> Result<Var> {
        let mut x = embed("Gpt", &self.wte, &self.wpe, &self.drop, ids)?;
        let checkpointing = self.config.checkpoint && is_grad_enabled();
        for block in &self.blocks {
            x = if checkpointing { checkpointed(block, &x)? } else { block.forward(&x)? };
        }
        project("Gpt", &self.ln_f, &self.wte.weight, &x)
    }

    /// The mean cross entropy of the next-token predictions for `ids`
    /// against `targets` (both `[N, T]` `i64`; `targets` is usually `ids`
    /// shifted by one token).
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Var> {
        if targets.dims() != ids.dims() {
            return Err(NnError::invalid(
                "Gpt",
                format!("targets must have the shape of the ids, {:?}, got {:?}", ids.dims(), targets.dims()),
            ));
        }
        let logits = self.logits(ids)?;
        let vocab = logits.dims()[2] as isize;
        cross_entropy(&logits.reshape(&[-1, vocab])?, &targets.reshape(&[-1])?)
    }

    /// `prompt` followed by `max_new_tokens` tokens sampled one at a time
    /// (each from the logits of the last `block_size` tokens, as
    /// [`SampleOptions`] says), computed in evaluation mode without a graph;
    /// the train/eval mode is restored afterwards. The same model, prompt
    /// and options give the same tokens.
    pub fn generate(&mut self, prompt: &[i64], max_new_tokens: usize, options: &SampleOptions) -> Result<Vec<i64>> {
        options.validate()?;
        if prompt.is_empty() {
            return Err(NnError::invalid("Gpt::generate", "the prompt must hold at least one token"));
        }
        let training = self.is_training();
        self.eval();
        let tokens = self.sample(prompt, max_new_tokens, options);
        if training {
            self.train();
        }
        tokens
    }

    fn sample(&self, prompt: &[i64], max_new_tokens: usize, options: &SampleOptions) -> Result<Vec<i64>> {
        let _no_grad = no_grad();
        let device = self.wte.weight.device();
        let block_size = self.wpe.num_embeddings();
        let mut generator = Generator::new(options.seed);
        let mut tokens = prompt.to_vec();
        for _ in 0..max_new_tokens {
            let context = &tokens[tokens.len().saturating_sub(block_size)..];
            let ids = Tensor::from_vec_on(context.to_vec(), [1, context.len()], device)?;
            let logits = self.logits(&ids)?;
            let last = logits.tensor().narrow(1, context.len() - 1, 1)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
            tokens.push(draw(&last, options, &mut generator)? as i64);
        }
        Ok(tokens)
    }
}

impl Module for Gpt {
    /// The logits of the token ids in `input` (a `Var` wrapping an `[N, T]`
    /// `i64` tensor), as [`Gpt::logits`].
    fn forward(&self, input: &Var) -> Result<Var> {
        self.logits(input.tensor())
    }
}

/// The first unit of [`Gpt::into_units`]: the token and position
/// embeddings and the dropout on their sum, `dropout(wte[ids] + wpe[0..T])`.
/// Its input is a `Var` wrapping `[N, T]` `i64` token ids
/// (`1 ≤ T ≤ block_size`); its output the hidden states `[N, T, n_embd]`.
#[derive(crate::Parameters)]
pub struct GptEmbedding {
    /// Token embedding `[vocab_size, n_embd]`; [`GptHead::wte`] is the same
    /// table (one `Var`).
    pub wte: Embedding,
    /// Position embedding `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// Dropout on the summed embeddings.
    pub drop: Dropout,
}

impl Module for GptEmbedding {
    /// `dropout(wte[ids] + wpe[0..T])` for the ids in `input`, as
    /// [`Gpt::logits`] begins; an error names the expected input otherwise.
    fn forward(&self, input: &Var) -> Result<Var> {
        embed("GptEmbedding", &self.wte, &self.wpe, &self.drop, input.tensor())
    }
}

/// The last unit of [`Gpt::into_units`]: the final norm and the output
/// projection tied to the token embedding, `ln_f(x) · wteᵀ`, from the
/// hidden states `[N, T, n_embd]` to the logits `[N, T, vocab_size]`.
#[derive(crate::Parameters)]
pub struct GptHead {
    /// The final norm.
    pub ln_f: LayerNorm,
    /// The token embedding, used as the output projection: a handle on
    /// [`GptEmbedding::wte`] (its `weight` is the same `Var`, so its
    /// gradient gets both uses).
    pub wte: Embedding,
}

impl Module for GptHead {
    /// `ln_f(x) · wteᵀ`, as [`Gpt::logits`] ends.
    fn forward(&self, x: &Var) -> Result<Var> {
        project("GptHead", &self.ln_f, &self.wte.weight, x)
    }
}

impl Gpt {
    /// The model as a [`Sequential`] of `n_layer + 2` units,
    /// `[GptEmbedding, block 0, ..., block n_layer-1, GptHead]`, the shape
    /// fully sharded data parallelism takes (each layer a unit). Its `forward` on a `Var` wrapping `[N, T]` `i64` ids gives
    /// the logits of [`Gpt::logits`] with the same ops in the same order
    /// (the same values bit for bit, in training mode too from the same
    /// generator state); the loss is `cross_entropy` of the logits
    /// reshaped to `[N·T, vocab_size]` against the targets reshaped to
    /// `[N·T]`, as [`Gpt::loss`] computes it.
    ///
    /// The parameters are the model's own (moved, not copied), and the
    /// head holds the same `wte.weight` `Var` as the embedding unit: the
    /// tie survives, and a sharded wrapper sees one parameter in two
    /// layers. [`GptConfig::checkpoint`] does not carry over: checkpoint
    /// the units with the wrapper (for example FSDP's `checkpoint`
    /// setting, which gathers a unit's parameters again to recompute it).
    ///
    /// Names: the Sequential's layers are `0`, `1`, ..., so its
    /// parameters are the model's with the unit's index in front of the
    /// embedding's and the head's names and in place of `blocks.<i>` for a
    /// block: `0.wte.weight`, `0.wpe.weight`, `<i+1>.ln_1.weight` (for
    /// `blocks.<i>.ln_1.weight`), `<n_layer+1>.ln_f.weight`. The tied
    /// table is listed once, under its first name `0.wte.weight` (as
    /// every state dict lists a shared parameter).
    /// [`Gpt::name_from_units`] and [`Gpt::name_in_units`] translate;
    /// [`Gpt::load_units_state_dict`] loads such a dict (a gathered
    /// sharded model's, say) into a `Gpt`, and [`Gpt::units_state_dict`]
    /// gives a `Gpt`'s under the units' names.
    ///
    /// ```
    /// use brasa_nn::models::{Gpt, GptConfig};
    /// use brasa_nn::{Module, ModuleExt};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{Device, Tensor};
    ///
    /// let config = GptConfig::new(16, 8, 2, 2, 32);
    /// let reference = Gpt::new(config, Device::CPU)?;
    /// let units = Gpt::new(config, Device::CPU)?.into_units(); // the same weights (the same seed)
    /// assert_eq!(units.len(), 4); // embedding, 2 blocks, head
    /// let ids = Tensor::from_vec((0..16).collect::<Vec<i64>>(), [2, 8])?;
    /// let logits = units.forward(&Var::new(ids.clone()))?;
    /// assert_eq!(logits.tensor().to_vec::<f32>()?, reference.logits(&ids)?.tensor().to_vec::<f32>()?);
    /// // Back into a Gpt, by name.
    /// let fresh = Gpt::new(config.init_seed(1), Device::CPU)?;
    /// fresh.load_units_state_dict(&units.state_dict(), true)?;
    /// assert_eq!(fresh.logits(&ids)?.tensor().to_vec::<f32>()?, logits.tensor().to_vec::<f32>()?);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    pub fn into_units(self) -> Sequential {
        let Gpt { wte, wpe, drop, blocks, ln_f, config: _ } = self;
        let head = GptHead { ln_f, wte: wte.clone() };
        let mut units = Sequential::new().push(GptEmbedding { wte, wpe, drop });
        for block in blocks {
            units = units.push(block);
        }
        units.push(head)
    }

    /// The model's name (`blocks.1.attn.in_proj_weight`) of the parameter
    /// or buffer named `name` in the [`Gpt::into_units`] Sequential of a
    /// model of `n_layer` blocks (`2.attn.in_proj_weight`); `None` when no
    /// parameter of such a model has that name.
    pub fn name_from_units(name: &str, n_layer: usize) -> Option<String> {
        let (index, rest) = name.split_once('.')?;
        let index: usize = index.parse().ok()?;
        let field = rest.split('.').next()?;
        match index {
            0 if matches!(field, "wte" | "wpe") => Some(rest.to_string()),
            i if (1..=n_layer).contains(&i) && BLOCK_FIELDS.contains(&field) => {
                Some(format!("blocks.{}.{rest}", i - 1))
            }
            i if i == n_layer + 1 && matches!(field, "ln_f" | "wte") => Some(rest.to_string()),
            _ => None,
        }
    }

    /// The name in the [`Gpt::into_units`] Sequential of a model of
    /// `n_layer` blocks of the model's parameter or buffer `name`: the
    /// inverse of [`Gpt::name_from_units`] (`wte.weight` is `0.wte.weight`,
    /// its first name there); `None` for a name the model does not have.
    pub fn name_in_units(name: &str, n_layer: usize) -> Option<String> {
        let (field, rest) = name.split_once('.')?;
        match field {
            "wte" | "wpe" => Some(format!("0.{name}")),
            "ln_f" => Some(format!("{}.{name}", n_layer + 1)),
            "blocks" => {
                let (index, rest) = rest.split_once('.')?;
                let index: usize = index.parse().ok()?;
                let block_field = rest.split('.').next()?;
                (index < n_layer && BLOCK_FIELDS.contains(&block_field)).then(|| format!("{}.{rest}", index + 1))
            }
            _ => None,
        }
    }

    /// Copies `dict`, a state dict under the names of the
    /// [`Gpt::into_units`] Sequential (its `state_dict()`, or a sharded
    /// model's gathered full state dict), into this model, renamed by
    /// [`Gpt::name_from_units`]. `strict` as in
    /// [`ModuleExt::load_state_dict`]: a name that maps to none of the
    /// model's (reported under its own name), a missing one, or another
    /// shape or dtype is an error naming it, and nothing is copied.
    pub fn load_units_state_dict(&self, dict: &StateDict, strict: bool) -> Result<LoadReport> {
        let n_layer = self.blocks.len();
        let mut renamed = StateDict::new();
        for (name, tensor) in dict.iter() {
            let target = Gpt::name_from_units(name, n_layer).unwrap_or_else(|| name.to_string());
            // The head's handle on the tied table (in a dict of the head
            // alone) is the table itself: the first entry stands.
            if renamed.get(&target).is_none() {
                renamed.insert(target, tensor.clone());
            }
        }
        self.load_state_dict(&renamed, strict)
    }

    /// This model's state dict under the names of its [`Gpt::into_units`]
    /// Sequential (sharing storage with the model), to load into the
    /// Sequential or a sharded model of it.
    pub fn units_state_dict(&self) -> StateDict {
        let n_layer = self.blocks.len();
        let mut renamed = StateDict::new();
        for (name, tensor) in self.state_dict().iter() {
            // Every name of the model has a place in the units.
            let target = Gpt::name_in_units(name, n_layer).unwrap_or_else(|| name.to_string());
            renamed.insert(target, tensor.clone());
        }
        renamed
    }
}

/// The fields of a [`GptBlock`], the first part of its parameters' names.
const BLOCK_FIELDS: [&str; 6] = ["ln_1", "attn", "ln_2", "mlp_fc", "mlp_proj", "resid_dropout"];

/// `dropout(wte[ids] + wpe[0..T])`, after checking the ids (`[N, T]` `i64`,
/// `1 ≤ T ≤ block_size`); `what` names the caller in the error.
fn embed(what: &'static str, wte: &Embedding, wpe: &Embedding, drop: &Dropout, ids: &Tensor) -> Result<Var> {
    let block_size = wpe.num_embeddings();
    if ids.dtype() != DType::I64 || ids.rank() != 2 || ids.dims()[1] == 0 || ids.dims()[1] > block_size {
        return Err(NnError::invalid(
            what,
            format!(
                "expected i64 token ids [N, T] with 1 <= T <= {block_size} (the context), got a {} tensor of shape {:?}",
                ids.dtype(),
                ids.dims()
            ),
        ));
    }
    let t = ids.dims()[1];
    let positions = Tensor::arange_on(0.0, t as f64, 1.0, DType::I64, ids.device())?;
    let tokens = wte.lookup(ids)?;
    drop.forward(&tokens.add(&wpe.lookup(&positions)?)?)
}

/// `ln_f(x) · wteᵀ` for hidden states `x` (`[N, T, n_embd]`); `what` names
/// the caller in the error.
fn project(what: &'static str, ln_f: &LayerNorm, wte: &Var, x: &Var) -> Result<Var> {
    let n_embd = wte.dims()[1];
    if x.rank() != 3 || x.dims()[2] != n_embd {
        return Err(NnError::invalid(
            what,
            format!("expected hidden states [N, T, {n_embd}], got a {} tensor of shape {:?}", x.dtype(), x.dims()),
        ));
    }
    // The head is the token embedding: its gradient gets both uses.
    Ok(ln_f.forward(x)?.linear(wte, None)?)
}

/// `block` on `x` as an activation checkpoint.
fn checkpointed(block: &GptBlock, x: &Var) -> Result<Var> {
    let block = block.clone();
    Ok(checkpoint(
        move |xs: &[Var]| {
            let x = xs.first().ok_or_else(|| AutogradError::invalid("GptBlock", "checkpoint lost its input"))?;
            block.forward(x).map_err(into_autograd)
        },
        &[x],
    )?)
}

/// An error of a checkpointed block, as autograd carries it.
fn into_autograd(error: NnError) -> AutogradError {
    match error {
        NnError::Autograd(e) => e,
        NnError::Tensor(e) => AutogradError::Tensor(e),
        other => AutogradError::External(SharedError::new(other)),
    }
}

/// A token drawn from `softmax(logits / temperature)` restricted to the
/// `top_k` largest logits (ties with the k-th kept, as nanoGPT's filter).
fn draw(logits: &[f32], options: &SampleOptions, generator: &mut Generator) -> Result<usize> {
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / options.temperature).collect();
    let mut sorted = scaled.clone();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let k = options.top_k.unwrap_or(sorted.len()).min(sorted.len());
    let (Some(&max), Some(&threshold)) = (sorted.first(), sorted.get(k.saturating_sub(1))) else {
        return Err(NnError::invalid("Gpt::generate", "the model produced no logits"));
    };
    if sorted.iter().any(|l| !l.is_finite()) {
        return Err(NnError::invalid("Gpt::generate", "the model's logits are not finite (NaN or infinity)"));
    }
    let weights: Vec<f64> = scaled.iter().map(|&l| if l >= threshold { (l - max).exp() } else { 0.0 }).collect();
    let total: f64 = weights.iter().sum();
    let mut u = [0f64];
    generator.fill_uniform_f64(&mut u, 0.0, total).map_err(TensorError::from)?;
    let mut cumulative = 0.0;
    let mut last_kept = 0;
    for (token, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cumulative += w;
            last_kept = token;
            if u[0] < cumulative {
                return Ok(token);
            }
        }
    }
    Ok(last_kept) // rounding left u at the very top: the last kept token
}

/// A tensor of `N(0, std)` values from `generator`.
fn normal(generator: &mut Generator, dims: &[usize], std: f64, dtype: DType, device: Device) -> Result<Tensor> {
    if device.is_meta() {
        // A memory plan needs the allocations, not the draws (GPT-2's token
        // table alone is 38.6M of them): the same f32 tensor, then the cast.
        return Ok(Tensor::zeros_on(dims.to_vec(), DType::F32, device)?.to_dtype(dtype)?);
    }
    let mut values = vec![0f32; dims.iter().product()];
    generator.fill_normal_f32(&mut values, 0.0, std as f32).map_err(TensorError::from)?;
    Ok(Tensor::from_vec_on(values, dims, device)?.to_dtype(dtype)?)
}

/// A parameter of `N(0, std)` values from `generator`.
fn normal_param(generator: &mut Generator, dims: &[usize], std: f64, dtype: DType, device: Device) -> Result<Var> {
    Ok(Var::param(normal(generator, dims, std, dtype, device)?)?)
}

/// A linear layer `in → out`: weight `N(0, std)`, bias (if the config has
/// them) zero.
fn linear(
    generator: &mut Generator,
    in_features: usize,
    out_features: usize,
    std: f64,
    config: &GptConfig,
    device: Device,
) -> Result<Linear> {
    let weight = normal_param(generator, &[out_features, in_features], std, config.dtype, device)?;
    let bias =
        if config.bias { Some(Var::param(Tensor::zeros_on([out_features], config.dtype, device)?)?) } else { None };
    Ok(Linear { weight, bias })
}
