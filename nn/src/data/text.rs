//! Character-level text for language models: a [`CharVocab`] (the distinct
//! characters of a text, sorted, each a token id) and [`TokenWindows`]
//! (a token stream that hands out random training windows, nanoGPT's
//! `get_batch`: inputs `x = tokens[i..i+T]`, targets `y = tokens[i+1..i+T+1]`).
//!
//! ```
//! use brasa_nn::data::{CharVocab, TokenWindows};
//! use brasa_tensor::{Device, Generator};
//!
//! let text = "to be or not to be";
//! let vocab = CharVocab::from_text(text)?;
//! assert_eq!(vocab.len(), 7);                                   // ' ', b, e, n, o, r, t
//! let tokens = vocab.encode(text)?;
//! assert_eq!(vocab.decode(&tokens)?, text);
//! let windows = TokenWindows::new(tokens);
//! let (x, y) = windows.sample_batch(4, 8, &mut Generator::new(0), Device::CPU)?;
//! assert_eq!((x.dims(), y.dims()), (&[4, 8][..], &[4, 8][..]));
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use brasa_tensor::{Device, Generator, Tensor, TensorError};
use std::collections::HashMap;
use std::sync::Arc;

/// The distinct characters of a text, sorted by code point; a character's
/// token id is its index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
    ids: HashMap<char, i64>,
}

impl CharVocab {
    /// The vocabulary of `text` (an empty text is an error: no tokens).
    pub fn from_text(text: &str) -> Result<CharVocab> {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab::from_chars(chars)
    }

    /// A vocabulary of these characters, in this order (each at most once).
    pub fn from_chars(chars: Vec<char>) -> Result<CharVocab> {
        if chars.is_empty() {
            return Err(NnError::invalid("CharVocab", "a vocabulary needs at least one character"));
        }
        let mut ids = HashMap::with_capacity(chars.len());
        for (id, &c) in chars.iter().enumerate() {
            if ids.insert(c, id as i64).is_some() {
                return Err(NnError::invalid("CharVocab", format!("the character {c:?} appears twice")));
            }
        }
        Ok(CharVocab { chars, ids })
    }

    /// The number of characters (token ids are `0..len`).
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Always false: a vocabulary has at least one character.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The characters, in token-id order.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The token id of `c`, if it is in the vocabulary.
    pub fn id(&self, c: char) -> Option<i64> {
        self.ids.get(&c).copied()
    }

    /// The token ids of `text`; a character outside the vocabulary is an
    /// error naming it and its position.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        text.chars()
            .enumerate()
            .map(|(position, c)| {
                self.id(c).ok_or_else(|| {
                    NnError::invalid(
                        "CharVocab",
                        format!("character {c:?} at position {position} is not in the vocabulary"),
                    )
                })
            })
            .collect()
    }

    /// The text of token ids; an id outside `0..len` is an error.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        ids.iter()
            .map(|&id| {
                usize::try_from(id).ok().and_then(|i| self.chars.get(i).copied()).ok_or_else(|| {
                    NnError::invalid(
                        "CharVocab",
                        format!("token id {id} is outside the vocabulary (0..{})", self.chars.len()),
                    )
                })
            })
            .collect()
    }
}

/// A stream of token ids that hands out random windows for next-token
/// prediction. Cloning shares the tokens.
#[derive(Clone, Debug)]
pub struct TokenWindows {
    tokens: Arc<[i64]>,
}

impl TokenWindows {
    /// A stream of these token ids.
    pub fn new(tokens: Vec<i64>) -> TokenWindows {
        TokenWindows { tokens: tokens.into() }
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token ids.
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    /// `batch` windows of `context` tokens starting at positions drawn
    /// uniformly from `0..len − context` with `generator` (nanoGPT's
    /// `torch.randint(len(data) − block_size, (batch_size,))`): inputs
    /// `[batch, context]` and the targets, the same windows shifted by one
    /// token, both `i64` on `device`. The stream must hold more than
    /// `context` tokens.
    pub fn sample_batch(
        &self,
        batch: usize,
        context: usize,
        generator: &mut Generator,
        device: Device,
    ) -> Result<(Tensor, Tensor)> {
        if batch == 0 || context == 0 {
            return Err(NnError::invalid(
                "TokenWindows",
                format!("batch and context must be positive, got batch {batch} and context {context}"),
            ));
        }
        if self.tokens.len() <= context {
            return Err(NnError::invalid(
                "TokenWindows",
                format!(
                    "a window of {context} tokens and its shifted target need more than {context} tokens, the stream \
                     has {}",
                    self.tokens.len()
                ),
            ));
        }
        let starts_range = self.tokens.len() - context;
        let mut draws = vec![0f64; batch];
        generator.fill_uniform_f64(&mut draws, 0.0, 1.0).map_err(TensorError::from)?;
        let (mut x, mut y) = (Vec::with_capacity(batch * context), Vec::with_capacity(batch * context));
        for u in draws {
            let start = ((u * starts_range as f64) as usize).min(starts_range - 1);
            x.extend_from_slice(&self.tokens[start..start + context]);
            y.extend_from_slice(&self.tokens[start + 1..start + context + 1]);
        }
        Ok((Tensor::from_vec_on(x, [batch, context], device)?, Tensor::from_vec_on(y, [batch, context], device)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_shifted_slices_of_the_stream() {
        let windows = TokenWindows::new((0..100).collect());
        let (x, y) = windows.sample_batch(16, 10, &mut Generator::new(3), Device::CPU).unwrap();
        let (x, y) = (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
        for (xs, ys) in x.chunks(10).zip(y.chunks(10)) {
            let start = xs[0];
            assert!((0..90).contains(&start), "{start}");
            assert!(xs.iter().enumerate().all(|(i, &t)| t == start + i as i64), "{xs:?}");
            assert!(ys.iter().zip(xs).all(|(&b, &a)| b == a + 1), "{ys:?}");
        }
        // The same generator state gives the same windows.
        let again = windows.sample_batch(16, 10, &mut Generator::new(3), Device::CPU).unwrap().0;
        assert_eq!(again.to_vec::<i64>().unwrap(), x);
    }

    #[test]
    fn refusals_name_the_problem() {
        let windows = TokenWindows::new(vec![1, 2, 3]);
        // Every refusal is an NnError::Invalid of its type; the message
        // names the problem, which is the point here.
        let invalid = |err: NnError, what: &str| match err {
            NnError::Invalid { what: w, message } if w == what => message,
            other => panic!("expected an Invalid error of {what}, got {other:?}"),
        };
        let err = windows.sample_batch(2, 3, &mut Generator::new(0), Device::CPU).unwrap_err();
        assert!(invalid(err, "TokenWindows").contains("more than 3 tokens"));
        let err = windows.sample_batch(0, 1, &mut Generator::new(0), Device::CPU).unwrap_err();
        assert!(invalid(err, "TokenWindows").starts_with("batch and context must be positive"));
        let vocab = CharVocab::from_text("ab").unwrap();
        assert!(invalid(vocab.encode("abc").unwrap_err(), "CharVocab").contains("'c' at position 2"));
        assert!(invalid(vocab.decode(&[0, 2]).unwrap_err(), "CharVocab").contains("token id 2"));
        invalid(CharVocab::from_text("").unwrap_err(), "CharVocab");
        assert!(invalid(CharVocab::from_chars(vec!['a', 'a']).unwrap_err(), "CharVocab").contains("appears twice"));
    }
}
