//! The tekken tokenizer (Mistral's tiktoken-style byte-level BPE), built from a GGUF's
//! `tokenizer.ggml.*` metadata.
//!
//! Algorithm (mistral-common `tokens/tokenizers/tekken.py`; llama.cpp `src/llama-vocab.cpp`,
//! pre-tokenizer `tekken`):
//! 1. Encode: split the text with the tekken regex ([`TEKKEN_PATTERN`], "isolated" pieces), map each
//!    piece's UTF-8 bytes to GPT-2's byte-to-unicode alphabet, then run BPE by merge rank over
//!    `tokenizer.ggml.merges`. A piece that is itself a vocabulary entry is emitted whole without
//!    merging (`ignore_merges`, as tiktoken and llama.cpp's tekken do). The regex split and the
//!    BPE are the HF `tokenizers` crate's `Split` + `ByteLevel` pre-tokenizers and `BPE` model.
//! 2. Control tokens (GGUF token type 3, ids 0..999 in tekken; type 2, `<unk>`, is treated the
//!    same) are left out of the BPE vocabulary, so text never produces them: `"[INST]"` in text
//!    is plain text, as in mistral-common. The chat layer inserts control ids itself.
//! 3. Decode follows mistral-common `Tekkenizer.decode`: consecutive ordinary ids are grouped, each
//!    group's bytes are decoded as UTF-8 with U+FFFD for every maximal invalid subpart (Python's
//!    `errors="replace"`, Rust's `String::from_utf8_lossy`), and control ids are dropped (or, in
//!    the keep-special variants, written as their text). A control id therefore splits a
//!    multi-byte character into two U+FFFD halves, as mistral-common does.
//! 4. [`StreamDecoder`] emits the same text incrementally, holding back an incomplete trailing
//!    UTF-8 sequence until it completes or is proven invalid.
//! 5. [`Tokenizer::encode_within`] encodes long text in chunks of about [`CHUNK_BYTES`] that end
//!    where the tekken regex ends a piece and the last character is not whitespace. The regex has
//!    no anchors or look-behind, and its one look-ahead (`\s+(?!\S)`) can only read past a
//!    chunk's end from a whitespace run that reaches it; so the text before such a cut splits into
//!    the same pieces alone as inside the whole text, and the ids are those of
//!    [`Tokenizer::encode`]. Encoding stops at the first chunk past the limit, and a chunk too
//!    long to fit even if every id were the longest token is not encoded at all.

use std::collections::HashMap;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::utils::SysRegex;
use tokenizers::SplitDelimiterBehavior;

use crate::gguf::{GgufFile, MetaArray, MetaValue};

/// The tekken pre-tokenizer regex (the `config.pattern` of every released `tekken.json`).
///
/// Unlike cl100k it has no contraction alternatives, splits words at lower→upper case
/// boundaries, keeps combining marks (`\p{M}`) inside words and splits digits one by one.
/// llama.cpp runs an approximation without `\p{M}`; this is the exact pattern, which is what
/// mistral-common (tiktoken) and HF `tokenizers` run.
pub const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Bytes of text [`Tokenizer::encode_within`] encodes at a time (rounded up to a piece end).
pub const CHUNK_BYTES: usize = 16 * 1024;

/// GGUF token types (gguf-py `TokenType`, llama.cpp `llama_token_type`).
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
}

/// Errors building a [`Tokenizer`] or encoding with it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required `tokenizer.ggml.*` key is absent.
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(&'static str),
    /// A key holds a value of the wrong type.
    #[error("GGUF metadata key `{key}` must be {expected}")]
    WrongType {
        /// The metadata key.
        key: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` is not `gpt2` (byte-level BPE).
    #[error("tokenizer.ggml.model = {0:?} is not supported (only \"gpt2\", byte-level BPE)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this engine does not implement.
    #[error("tokenizer.ggml.pre = {0:?} is not supported (only \"tekken\")")]
    UnsupportedPre(String),
    /// `tokenizer.ggml.tokens` is empty or longer than the u32 id space.
    #[error("tokenizer.ggml.tokens has {0} entries; expected 1..=2^32")]
    VocabSize(usize),
    /// `tokenizer.ggml.token_type` and `tokenizer.ggml.tokens` differ in length.
    #[error(
        "tokenizer.ggml.token_type has {types} entries but tokenizer.ggml.tokens has {tokens}"
    )]
    TokenTypeCount {
        /// Length of `tokenizer.ggml.tokens`.
        tokens: usize,
        /// Length of `tokenizer.ggml.token_type`.
        types: usize,
    },
    /// A token type other than NORMAL (1), UNKNOWN (2) or CONTROL (3).
    #[error("token {id} has token type {token_type}; only 1 (normal), 2 (unknown) and 3 (control) are supported")]
    UnsupportedTokenType {
        /// The token id.
        id: u32,
        /// Its `tokenizer.ggml.token_type` value.
        token_type: i32,
    },
    /// A normal token's text has a character outside GPT-2's byte-to-unicode alphabet.
    #[error(
        "token {id} ({text:?}) has character {ch:?}, which is not in the GPT-2 byte-level alphabet"
    )]
    NotByteLevel {
        /// The token id.
        id: u32,
        /// The token text.
        text: String,
        /// The offending character.
        ch: char,
    },
    /// Two tokens of the same kind (both normal or both control) have the same text.
    #[error("tokens {first} and {second} both have the text {text:?}")]
    DuplicateToken {
        /// The lower id.
        first: u32,
        /// The higher id.
        second: u32,
        /// The shared text.
        text: String,
    },
    /// One of the 256 single-byte tokens is missing from the normal tokens.
    #[error("no normal token for byte 0x{byte:02x} (byte-level text {text:?})")]
    MissingByte {
        /// The byte.
        byte: u8,
        /// Its GPT-2 byte-to-unicode text.
        text: String,
    },
    /// A merge is not two tokens separated by one space.
    #[error("tokenizer.ggml.merges[{index}] = {merge:?} is not \"<left> <right>\"")]
    BadMerge {
        /// Index in `tokenizer.ggml.merges`.
        index: usize,
        /// The merge string.
        merge: String,
    },
    /// The BOS or EOS id is not a token of the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    SpecialOutOfRange {
        /// The metadata key.
        key: &'static str,
        /// The id it holds.
        id: u64,
        /// Number of tokens.
        n_vocab: usize,
    },
    /// The HF `tokenizers` BPE model or regex refused the vocabulary (e.g. a merge names a token
    /// that is not in the vocabulary).
    #[error("building the BPE model failed: {0}")]
    Build(#[source] tokenizers::Error),
    /// Encoding failed inside HF `tokenizers` (e.g. the regex engine's backtrack limit).
    #[error("encoding failed: {0}")]
    Encode(#[source] tokenizers::Error),
}

/// The vocabulary part of a GGUF's tokenizer metadata, as plain vectors.
///
/// Source of the keys: gguf-py `Keys.Tokenizer` (`tokenizer.ggml.model`, `.pre`, `.tokens`,
/// `.token_type`, `.merges`, `.bos_token_id`, `.eos_token_id`).
#[derive(Clone, Debug)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`; must be `"gpt2"`.
    pub model: String,
    /// `tokenizer.ggml.pre`; must be `"tekken"`.
    pub pre: String,
    /// `tokenizer.ggml.tokens`, indexed by id: GPT-2 byte-to-unicode strings for normal tokens,
    /// the literal text (`"[INST]"`) for control tokens.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token: 1 normal, 2 unknown, 3 control.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, `"left right"` strings in rank order (rank 0 first).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: u32,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: u32,
}

impl GgufVocab {
    /// Reads the tokenizer keys of `file`.
    ///
    /// Errors: [`TokenizerError::MissingKey`] / [`TokenizerError::WrongType`] naming the key.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufVocab, TokenizerError> {
        Ok(GgufVocab {
            model: meta_str(file, "tokenizer.ggml.model")?,
            pre: meta_str(file, "tokenizer.ggml.pre")?,
            tokens: meta_strings(file, "tokenizer.ggml.tokens")?,
            token_types: meta_i32s(file, "tokenizer.ggml.token_type")?,
            merges: meta_strings(file, "tokenizer.ggml.merges")?,
            bos_id: meta_id(file, "tokenizer.ggml.bos_token_id")?,
            eos_id: meta_id(file, "tokenizer.ggml.eos_token_id")?,
        })
    }
}

fn meta<'f>(file: &'f GgufFile, key: &'static str) -> Result<&'f MetaValue, TokenizerError> {
    file.get(key).ok_or(TokenizerError::MissingKey(key))
}

fn meta_str(file: &GgufFile, key: &'static str) -> Result<String, TokenizerError> {
    meta(file, key)?
        .as_str()
        .map(str::to_owned)
        .ok_or(TokenizerError::WrongType {
            key,
            expected: "a string",
        })
}

fn meta_strings(file: &GgufFile, key: &'static str) -> Result<Vec<String>, TokenizerError> {
    let wrong = TokenizerError::WrongType {
        key,
        expected: "an array of strings",
    };
    Ok(meta(file, key)?.as_strings().ok_or(wrong)?.to_vec())
}

fn meta_i32s(file: &GgufFile, key: &'static str) -> Result<Vec<i32>, TokenizerError> {
    let wrong = || TokenizerError::WrongType {
        key,
        expected: "an array of integers in the i32 range",
    };
    match meta(file, key)?.as_array().ok_or_else(wrong)? {
        MetaArray::I32(values) => Ok(values.clone()),
        other => other
            .iter()
            .map(|v| {
                v.as_i64()
                    .and_then(|x| i32::try_from(x).ok())
                    .ok_or_else(wrong)
            })
            .collect(),
    }
}

fn meta_id(file: &GgufFile, key: &'static str) -> Result<u32, TokenizerError> {
    let id = meta(file, key)?.as_u64().ok_or(TokenizerError::WrongType {
        key,
        expected: "an unsigned integer",
    })?;
    u32::try_from(id).map_err(|_| TokenizerError::WrongType {
        key,
        expected: "a token id below 2^32",
    })
}

/// GPT-2's byte-to-unicode table (openai/gpt-2 `encoder.py` `bytes_to_unicode`): printable
/// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
fn byte_level_decode_table() -> HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut next = 0x100u32;
    let mut table = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let ch = if printable(b) {
            char::from(b)
        } else {
            let ch = char::from_u32(next).expect("U+0100..=U+0143 are Unicode scalar values");
            next += 1;
            ch
        };
        table.insert(ch, b);
    }
    table
}

/// A tekken tokenizer: encode text to ids and decode ids to text.
///
/// Ids are `u32` in `0..n_vocab()`. Built once per model; `Send + Sync`, so one instance serves
/// all requests.
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    /// The pre-tokenizer's regex, to find piece ends for chunked encoding.
    pieces: SysRegex,
    /// Bytes of the longest ordinary token (at least 1).
    max_token_bytes: usize,
    /// Concatenated bytes of every token (control tokens: their text), indexed by `offsets`.
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` is token `id`'s byte range; length `n_vocab + 1`.
    offsets: Vec<usize>,
    /// Whether each id is a control (or unknown) token.
    control: Vec<bool>,
    special_ids: HashMap<String, u32>,
    bos_id: u32,
    eos_id: u32,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab())
            .field("n_control", &self.special_ids.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

/// What one id stands for.
enum Piece<'a> {
    Normal(&'a [u8]),
    Control(&'a [u8]),
    OutOfRange,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` metadata (see [`GgufVocab`]).
    ///
    /// Errors: missing or mistyped keys, `model` ≠ `gpt2`, `pre` ≠ `tekken`, and every
    /// vocabulary defect [`Tokenizer::from_vocab`] reports.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_vocab(GgufVocab::from_gguf(file)?)
    }

    /// Builds the tokenizer from the metadata already read into vectors.
    ///
    /// Errors: `model` ≠ `"gpt2"`, `pre` ≠ `"tekken"` (no other pre-tokenizer is guessed),
    /// token/token-type count mismatch, token types other than 1/2/3, a normal token outside the
    /// GPT-2 byte alphabet, duplicate token texts, a single byte without a token, malformed
    /// merges, merges naming unknown tokens, BOS/EOS out of range.
    pub fn from_vocab(vocab: GgufVocab) -> Result<Tokenizer, TokenizerError> {
        if vocab.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(vocab.model));
        }
        let pattern = match vocab.pre.as_str() {
            "tekken" => TEKKEN_PATTERN,
            _ => return Err(TokenizerError::UnsupportedPre(vocab.pre)),
        };
        let n = vocab.tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::VocabSize(n));
        }
        if vocab.token_types.len() != n {
            return Err(TokenizerError::TokenTypeCount {
                tokens: n,
                types: vocab.token_types.len(),
            });
        }
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", vocab.bos_id),
            ("tokenizer.ggml.eos_token_id", vocab.eos_id),
        ] {
            if id as usize >= n {
                return Err(TokenizerError::SpecialOutOfRange {
                    key,
                    id: u64::from(id),
                    n_vocab: n,
                });
            }
        }

        let decode_table = byte_level_decode_table();
        let mut bpe_vocab = Vocab::with_capacity(n);
        let mut special_ids = HashMap::new();
        let mut control = Vec::with_capacity(n);
        let mut bytes = Vec::with_capacity(n * 8);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (index, (text, &token_type)) in vocab.tokens.iter().zip(&vocab.token_types).enumerate()
        {
            // `n` fits in u32 (checked above), so every index does.
            let id = index as u32;
            let (is_control, previous) = match token_type {
                token_type::NORMAL => {
                    for ch in text.chars() {
                        let byte =
                            decode_table
                                .get(&ch)
                                .ok_or_else(|| TokenizerError::NotByteLevel {
                                    id,
                                    text: text.clone(),
                                    ch,
                                })?;
                        bytes.push(*byte);
                    }
                    (false, bpe_vocab.insert(text.clone(), id))
                }
                token_type::UNKNOWN | token_type::CONTROL => {
                    bytes.extend_from_slice(text.as_bytes());
                    (true, special_ids.insert(text.clone(), id))
                }
                other => {
                    return Err(TokenizerError::UnsupportedTokenType {
                        id,
                        token_type: other,
                    })
                }
            };
            if let Some(first) = previous {
                return Err(TokenizerError::DuplicateToken {
                    first,
                    second: id,
                    text: text.clone(),
                });
            }
            control.push(is_control);
            offsets.push(bytes.len());
        }

        // Byte-level BPE starts from single bytes; a byte without a token would be silently
        // dropped by the BPE model, so every one of the 256 must exist.
        if let Some((ch, byte)) = decode_table
            .iter()
            .filter(|(ch, _)| !bpe_vocab.contains_key(ch.to_string().as_str()))
            .min_by_key(|(_, byte)| **byte)
        {
            return Err(TokenizerError::MissingByte {
                byte: *byte,
                text: ch.to_string(),
            });
        }

        let merges = vocab
            .merges
            .iter()
            .enumerate()
            .map(|(index, merge)| match merge.split_once(' ') {
                Some((left, right))
                    if !left.is_empty() && !right.is_empty() && !right.contains(' ') =>
                {
                    Ok((left.to_owned(), right.to_owned()))
                }
                _ => Err(TokenizerError::BadMerge {
                    index,
                    merge: merge.clone(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;

        let bpe = BPE::builder()
            .vocab_and_merges(bpe_vocab, merges)
            .ignore_merges(true)
            .build()
            .map_err(TokenizerError::Build)?;
        let pieces = SysRegex::new(pattern).map_err(TokenizerError::Build)?;
        let split = Split::new(
            SplitPattern::Regex(pattern.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(TokenizerError::Build)?;
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ]);
        let mut hf = tokenizers::Tokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(pre_tokenizer));

        let max_token_bytes = offsets
            .windows(2)
            .zip(&control)
            .filter(|(_, &is_control)| !is_control)
            .map(|(w, _)| w[1] - w[0])
            .max()
            .unwrap_or(1)
            .max(1);
        Ok(Tokenizer {
            hf,
            pieces,
            max_token_bytes,
            bytes,
            offsets,
            control,
            special_ids,
            bos_id: vocab.bos_id,
            eos_id: vocab.eos_id,
        })
    }

    /// Encodes `text` to ids: no BOS/EOS, and no special-token parsing (text that looks like
    /// `"[INST]"` is encoded as ordinary text). Never returns a control id.
    ///
    /// Errors: [`TokenizerError::Encode`] if the regex engine gives up (its backtrack limit).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .hf
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes `text` as [`Tokenizer::encode`] does, unless that gives more than `limit` ids:
    /// then `None`, having encoded at most one chunk ([`CHUNK_BYTES`], longer only inside a
    /// whitespace run) past the `limit`-th id. Memory stays that of one chunk's encoding however
    /// long `text` is (module note, step 5).
    ///
    /// Errors: those of [`Tokenizer::encode`].
    pub fn encode_within(
        &self,
        text: &str,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, TokenizerError> {
        self.encode_chunked(text, limit, CHUNK_BYTES)
    }

    fn encode_chunked(
        &self,
        text: &str,
        limit: usize,
        chunk_bytes: usize,
    ) -> Result<Option<Vec<u32>>, TokenizerError> {
        // Piece ends in order; the text's end closes the last chunk (also when the regex gives
        // up early, so that encoding that chunk reports the same error the whole text would).
        let mut ends = self
            .pieces
            .find_iter(text)
            .map(|(_, end)| end)
            .chain(std::iter::once(text.len()));
        let mut ids = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = ends
                .by_ref()
                .find(|&end| {
                    end >= text.len()
                        || (end - start >= chunk_bytes
                            && !text[..end].ends_with(char::is_whitespace))
                })
                .unwrap_or(text.len());
            let chunk = &text[start..end];
            // Each id covers at most `max_token_bytes` bytes of the chunk.
            if ids
                .len()
                .saturating_add(chunk.len().div_ceil(self.max_token_bytes))
                > limit
            {
                return Ok(None);
            }
            ids.extend(self.encode(chunk)?);
            if ids.len() > limit {
                return Ok(None);
            }
            start = end;
        }
        Ok(Some(ids))
    }

    fn piece(&self, id: u32) -> Piece<'_> {
        let i = id as usize;
        match (
            self.control.get(i),
            self.offsets.get(i),
            self.offsets.get(i + 1),
        ) {
            (Some(&is_control), Some(&start), Some(&end)) => {
                let bytes = &self.bytes[start..end];
                if is_control {
                    Piece::Control(bytes)
                } else {
                    Piece::Normal(bytes)
                }
            }
            _ => Piece::OutOfRange,
        }
    }

    fn decode_impl(&self, ids: &[u32], keep_special: bool) -> String {
        let mut decoder = self.stream_decoder();
        let mut out = String::new();
        for &id in ids {
            out.push_str(&if keep_special {
                decoder.push_keep_special(id)
            } else {
                decoder.push(id)
            });
        }
        out.push_str(&decoder.finish());
        out
    }

    /// Decodes ids to text with mistral-common's default policy (`SpecialTokenPolicy.IGNORE`):
    /// control ids are dropped, each run of ordinary ids is decoded as lossy UTF-8 (one U+FFFD
    /// per maximal invalid subpart), so a control id inside a multi-byte character leaves two
    /// U+FFFD. An id ≥ `n_vocab()` is not a token; it is rendered as one U+FFFD and ends the run.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_impl(ids, false)
    }

    /// Like [`Tokenizer::decode`], but control ids are written as their text (`"[THINK]"`), as
    /// mistral-common's `SpecialTokenPolicy.KEEP` does.
    pub fn decode_keep_special(&self, ids: &[u32]) -> String {
        self.decode_impl(ids, true)
    }

    /// The raw bytes of token `id` (for a control token, the UTF-8 of its text), or `None` when
    /// `id ≥ n_vocab()`.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        match self.piece(id) {
            Piece::Normal(b) | Piece::Control(b) => Some(b),
            Piece::OutOfRange => None,
        }
    }

    /// The id of the control token whose text is `text` (`"[INST]"` → 3 in tekken v15), or
    /// `None` when no control token has that text.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.special_ids.get(text).copied()
    }

    /// Whether `id` is a control (or unknown) token; `false` for ids ≥ `n_vocab()`.
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// `tokenizer.ggml.bos_token_id` (`<s>` = 1 in tekken).
    pub fn bos_id(&self) -> u32 {
        self.bos_id
    }

    /// `tokenizer.ggml.eos_token_id` (`</s>` = 2 in tekken).
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Number of ids, control tokens included (131072 for Mistral Small 4).
    pub fn n_vocab(&self) -> usize {
        self.control.len()
    }

    /// A decoder that turns ids into text one at a time; see [`StreamDecoder`].
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tok: self,
            pending: Vec::new(),
        }
    }
}

/// Incremental detokenizer for streamed generation.
///
/// Concatenating the strings returned by [`StreamDecoder::push`] for every id and then
/// [`StreamDecoder::finish`] gives exactly [`Tokenizer::decode`] of the ids (and with
/// [`StreamDecoder::push_keep_special`], [`Tokenizer::decode_keep_special`]). A returned string
/// never ends inside a character: an incomplete trailing UTF-8 sequence (at most 3 bytes) is held
/// back until the next ids complete it, prove it invalid (then it becomes U+FFFD), or a control id
/// or `finish` flushes it (then it becomes one U+FFFD, as mistral-common decodes it).
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Feeds one id and returns the newly completed text; control ids are dropped (they still
    /// end the current byte run, flushing an incomplete character as U+FFFD).
    pub fn push(&mut self, id: u32) -> String {
        self.push_impl(id, false)
    }

    /// Like [`StreamDecoder::push`], but a control id is returned as its text (`"[THINK]"`).
    pub fn push_keep_special(&mut self, id: u32) -> String {
        self.push_impl(id, true)
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn holds_back(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Characters that pushing `id` next would release ahead of `id`'s own text: 1 when the
    /// bytes held back turn out invalid (`id` does not continue their character, or ends the
    /// byte run) and become U+FFFD, else 0. A token's offset in the text is the characters
    /// released before it plus this.
    pub fn resolved_before(&self, id: u32) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        match self.tok.piece(id) {
            Piece::Normal(bytes) => {
                let mut next = self.pending.clone();
                next.extend(bytes.iter().take(4));
                match std::str::from_utf8(&next) {
                    Err(e) if e.valid_up_to() == 0 && e.error_len().is_some() => 1,
                    _ => 0,
                }
            }
            Piece::Control(_) | Piece::OutOfRange => 1,
        }
    }

    /// Flushes held-back bytes (an incomplete character becomes one U+FFFD). The decoder can be
    /// reused afterwards.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    fn push_impl(&mut self, id: u32, keep_special: bool) -> String {
        match self.tok.piece(id) {
            Piece::Normal(bytes) => {
                self.pending.extend_from_slice(bytes);
                self.drain_complete()
            }
            Piece::Control(text) => {
                let mut out = self.finish();
                if keep_special {
                    out.push_str(&String::from_utf8_lossy(text));
                }
                out
            }
            Piece::OutOfRange => {
                let mut out = self.finish();
                out.push(char::REPLACEMENT_CHARACTER);
                out
            }
        }
    }

    /// Emits every decided character of `pending` and keeps an incomplete tail.
    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(valid) => {
                    out.push_str(valid);
                    start = self.pending.len();
                    break;
                }
                Err(err) => {
                    let valid_end = start + err.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match err.error_len() {
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + len;
                        }
                        None => {
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A vocabulary with merges that cross every kind of piece boundary the regex makes (letter
    /// runs, case changes, digits, punctuation with newlines and '/', whitespace runs).
    fn merging_vocab() -> GgufVocab {
        let mut vocab = byte_vocab();
        for merge in ["Ġ a", "Ċ Ċ", ". /", "Ġ Ġ", "A b", "1 2"] {
            let (l, r) = merge.split_once(' ').unwrap_or_default();
            vocab.tokens.push(format!("{l}{r}"));
            vocab.token_types.push(1);
            vocab.merges.push(merge.to_owned());
        }
        vocab
    }

    proptest! {
        #[test]
        fn chunked_encoding_is_the_whole_encoding(
            text in "[abAB12 \\n\\r\\t./é\u{301}中]{0,200}",
            chunk in 1usize..40,
            limit in 0usize..250,
        ) {
            let tok = Tokenizer::from_vocab(merging_vocab()).expect("tokenizer");
            let whole = tok.encode(&text).expect("encode");
            let chunked = tok.encode_chunked(&text, usize::MAX, chunk).expect("chunked");
            prop_assert_eq!(chunked.as_ref(), Some(&whole));
            let within = tok.encode_chunked(&text, limit, chunk).expect("within");
            prop_assert_eq!(within.is_some(), whole.len() <= limit);
        }
    }

    #[test]
    fn encoding_within_a_limit_stops_early() {
        let tok = Tokenizer::from_vocab(byte_vocab()).expect("tokenizer");
        let text = "word ".repeat(1 << 20);
        assert_eq!(tok.encode_within(&text, 100).expect("encode"), None);
        let fits = tok.encode_within(&text[..500], 500).expect("encode");
        assert_eq!(fits.map(|ids| ids.len()), Some(500));
    }

    /// Ids 0..=255: the single bytes (GPT-2 byte-to-unicode text); 256: "ab" (merge "a b");
    /// 257..=259: control tokens `<s>`, `</s>`, `[INST]`.
    fn byte_vocab() -> GgufVocab {
        let mut by_byte: Vec<(u8, char)> = byte_level_decode_table()
            .into_iter()
            .map(|(c, b)| (b, c))
            .collect();
        by_byte.sort_unstable();
        let mut tokens: Vec<String> = by_byte.into_iter().map(|(_, c)| c.to_string()).collect();
        tokens.push("ab".into());
        let mut token_types = vec![1; tokens.len()];
        for control in ["<s>", "</s>", "[INST]"] {
            tokens.push(control.into());
            token_types.push(3);
        }
        GgufVocab {
            model: "gpt2".into(),
            pre: "tekken".into(),
            tokens,
            token_types,
            merges: vec!["a b".into()],
            bos_id: 257,
            eos_id: 258,
        }
    }

    const AB: u32 = 256;
    const INST: u32 = 259;

    #[test]
    fn byte_level_table_is_gpt2s() {
        // openai/gpt-2 encoder.py: space (0x20) is 'Ġ' (U+0120), newline (0x0A) is 'Ċ' (U+010A),
        // 0xAD is 'Ń' (U+0143), printable ASCII maps to itself.
        let table = byte_level_decode_table();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], 0x20);
        assert_eq!(table[&'Ċ'], 0x0A);
        assert_eq!(table[&'Ń'], 0xAD);
        assert_eq!(table[&'A'], b'A');
    }

    #[test]
    fn encodes_by_merge_and_never_produces_control_ids() {
        let tok = Tokenizer::from_vocab(byte_vocab()).expect("build");
        assert_eq!(
            tok.encode("abc").expect("encode"),
            vec![AB, u32::from(b'c')]
        );
        let ids = tok.encode("[INST]<s>").expect("encode");
        assert_eq!(
            ids,
            b"[INST]<s>"
                .iter()
                .map(|&b| u32::from(b))
                .collect::<Vec<_>>()
        );
        assert_eq!(tok.special_id("[INST]"), Some(INST));
        assert!(tok.is_control(INST) && !tok.is_control(AB));
        assert_eq!(tok.decode(&[AB, INST, u32::from(b'c')]), "abc");
        assert_eq!(
            tok.decode_keep_special(&[AB, INST, u32::from(b'c')]),
            "ab[INST]c"
        );
    }

    fn build_err(edit: impl FnOnce(&mut GgufVocab)) -> TokenizerError {
        let mut vocab = byte_vocab();
        edit(&mut vocab);
        match Tokenizer::from_vocab(vocab) {
            Ok(_) => panic!("a defective vocabulary was accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn refuses_defective_vocabularies() {
        assert!(
            matches!(build_err(|v| v.pre = "llama-bpe".into()), TokenizerError::UnsupportedPre(p) if p == "llama-bpe")
        );
        assert!(matches!(
            build_err(|v| v.model = "llama".into()),
            TokenizerError::UnsupportedModel(_)
        ));
        assert!(matches!(
            build_err(|v| {
                v.token_types.pop();
            }),
            TokenizerError::TokenTypeCount { .. }
        ));
        assert!(matches!(
            build_err(|v| v.token_types[5] = 6),
            TokenizerError::UnsupportedTokenType {
                id: 5,
                token_type: 6
            }
        ));
        assert!(matches!(
            build_err(|v| v.tokens[AB as usize] = "a b".into()),
            TokenizerError::NotByteLevel { ch: ' ', .. }
        ));
        assert!(matches!(
            build_err(|v| v.tokens[AB as usize] = "a".into()),
            TokenizerError::DuplicateToken { second: AB, .. }
        ));
        assert!(matches!(
            build_err(|v| v.token_types[usize::from(b'z')] = 3),
            TokenizerError::MissingByte { byte: b'z', .. }
        ));
        assert!(matches!(
            build_err(|v| v.merges.push("ab".into())),
            TokenizerError::BadMerge { index: 1, .. }
        ));
        assert!(matches!(
            build_err(|v| v.merges.push("ab c d".into())),
            TokenizerError::BadMerge { .. }
        ));
        assert!(matches!(
            build_err(|v| v.merges.push("ab ab".into())),
            TokenizerError::Build(_)
        ));
        assert!(matches!(
            build_err(|v| v.eos_id = 260),
            TokenizerError::SpecialOutOfRange { id: 260, .. }
        ));
        assert!(matches!(
            build_err(|v| v.tokens.clear()),
            TokenizerError::VocabSize(0)
        ));
    }

    /// mistral-common's decode, written out independently: split at control ids, decode each run
    /// of bytes with `from_utf8_lossy`, optionally writing control texts.
    fn reference_decode(tok: &Tokenizer, ids: &[u32], keep_special: bool) -> String {
        let mut out = String::new();
        let mut run = Vec::new();
        for &id in ids {
            if tok.is_control(id) {
                out.push_str(&String::from_utf8_lossy(&run));
                run.clear();
                if keep_special {
                    out.push_str(&String::from_utf8_lossy(
                        tok.token_bytes(id).unwrap_or_default(),
                    ));
                }
            } else {
                run.extend_from_slice(tok.token_bytes(id).unwrap_or_default());
            }
        }
        out.push_str(&String::from_utf8_lossy(&run));
        out
    }

    proptest! {
        #[test]
        fn stream_decoder_matches_lossy_decode(
            ids in proptest::collection::vec(prop_oneof![0u32..256, Just(AB), 257u32..260], 0..40),
            keep_special: bool,
        ) {
            let tok = Tokenizer::from_vocab(byte_vocab()).expect("build");
            let want = reference_decode(&tok, &ids, keep_special);
            let mut decoder = tok.stream_decoder();
            let mut out = String::new();
            for &id in &ids {
                out += &if keep_special { decoder.push_keep_special(id) } else { decoder.push(id) };
                // Nothing emitted is ever revised: no partial character went out early.
                prop_assert!(want.starts_with(&out), "{out:?} is not a prefix of {want:?}");
            }
            out += &decoder.finish();
            prop_assert_eq!(&out, &want);
            let whole = if keep_special { tok.decode_keep_special(&ids) } else { tok.decode(&ids) };
            prop_assert_eq!(whole, want);
        }
    }
}
