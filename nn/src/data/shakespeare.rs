//! Tiny Shakespeare, bundled with the crate: 1,115,394 characters of
//! Shakespeare's plays (65 distinct characters), the standard small corpus
//! for character-level language models (char-rnn, nanoGPT's
//! `shakespeare_char`).
//!
//! The text is embedded in the library (`include_bytes!`, 434 KB gzipped),
//! so [`TinyShakespeare::load`] works from any working directory and in the
//! published crate, with no download. Source: the char-rnn repository,
//! <https://github.com/karpathy/char-rnn> (MIT licence; the text is in the
//! public domain); see `data/tinyshakespeare/README.md` in the crate.

use super::text::{CharVocab, TokenWindows};
use crate::error::{NnError, Result};
use std::io::Read;

/// The gzipped text.
const INPUT_TXT_GZ: &[u8] = include_bytes!("../../data/tinyshakespeare/input.txt.gz");

/// How errors name the embedded file.
const SOURCE: &str = "tinyshakespeare/input.txt.gz (embedded in brasa-nn)";

/// The Tiny Shakespeare text and its character vocabulary.
///
/// ```
/// use brasa_nn::data::TinyShakespeare;
///
/// let corpus = TinyShakespeare::load()?;
/// assert_eq!(corpus.vocab().len(), TinyShakespeare::VOCAB_SIZE);     // 65 characters
/// assert!(corpus.text().starts_with("First Citizen:"));
/// let (train, val) = corpus.train_val()?;                           // nanoGPT's 90/10 split
/// assert_eq!((train.len(), val.len()), (1_003_854, 111_540));
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Clone, Debug)]
pub struct TinyShakespeare {
    text: String,
    vocab: CharVocab,
}

impl TinyShakespeare {
    /// The number of characters.
    pub const LEN: usize = 1_115_394;
    /// The number of distinct characters.
    pub const VOCAB_SIZE: usize = 65;
    /// The share of the text [`TinyShakespeare::train_val`] trains on (its
    /// start; the rest is held out).
    pub const TRAIN_FRACTION: f64 = 0.9;

    /// Decompresses the embedded text (tens of milliseconds) and builds its
    /// vocabulary. Nothing is cached: the text is the caller's alone.
    pub fn load() -> Result<TinyShakespeare> {
        let mut text = String::with_capacity(Self::LEN);
        flate2::read::GzDecoder::new(INPUT_TXT_GZ)
            .read_to_string(&mut text)
            .map_err(|e| NnError::file_error(SOURCE, "cannot decompress", e))?;
        if text.chars().count() != Self::LEN {
            return Err(NnError::file(
                SOURCE,
                format!("expected {} characters, found {}", Self::LEN, text.chars().count()),
            ));
        }
        let vocab = CharVocab::from_text(&text)?;
        if vocab.len() != Self::VOCAB_SIZE {
            return Err(NnError::file(
                SOURCE,
                format!("expected {} distinct characters, found {}", Self::VOCAB_SIZE, vocab.len()),
            ));
        }
        Ok(TinyShakespeare { text, vocab })
    }

    /// The whole text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The vocabulary: the 65 distinct characters, sorted (`'\n'` is id 0,
    /// `' '` id 1).
    pub fn vocab(&self) -> &CharVocab {
        &self.vocab
    }

    /// The text as token ids, split as nanoGPT splits it: the first
    /// `⌊0.9·len⌋` tokens for training, the rest held out for validation.
    pub fn train_val(&self) -> Result<(TokenWindows, TokenWindows)> {
        let mut tokens = self.vocab.encode(&self.text)?;
        let split = (tokens.len() as f64 * Self::TRAIN_FRACTION) as usize;
        let val = tokens.split_off(split);
        Ok((TokenWindows::new(tokens), TokenWindows::new(val)))
    }
}
