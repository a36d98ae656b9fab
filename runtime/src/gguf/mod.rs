//! GGUF v2/v3 reader, validating every field before anything is used.
//!
//! Layout (little-endian; gguf-py `gguf/gguf_reader.py`, llama.cpp `ggml/src/gguf.cpp`):
//! magic `"GGUF"`, `u32` version, `u64` tensor_count, `u64` kv_count, then kv_count key/value
//! pairs (key = gguf string = `u64` length + UTF-8 bytes; `u32` value type; value; an array is a
//! `u32` element type + `u64` count + the elements, arrays may nest), then tensor_count tensor
//! infos (name, `u32` n_dims, n_dims × `u64` ne, `u32` ggml type, `u64` offset relative to the data
//! section), padding to `general.alignment` (default 32), then the data section.
//!
//! Algorithm: one forward pass with a bounds-checked cursor. Every length or count read from the
//! file is compared against the bytes that remain *before* anything is allocated (a count of 2^60
//! fails as "too long", it never reaches an allocation), and pre-allocation is further capped at
//! `PREALLOC_MAX` entries so memory grows only with content actually parsed. After the header,
//! each tensor is checked in turn: dims (1..=4, nonzero, no overflow), type id, row length a
//! multiple of the block size, offset aligned, data range inside the file; then the ranges, sorted
//! by offset, are checked for overlap. Only a file that passes all of this becomes a [`GgufFile`], so
//! [`GgufFile::tensor_data`] can slice without further checks.
//!
//! This file is the reader; the folder also holds the format's other halves:
//! * [`write`] — the GGUF v3 writer (in memory for test files, streamed for large ones).
//! * [`quant`] — the reference ggml dequantizers and the oracle's f32 dot, bit-exact with ggml.

pub mod quant;
pub mod write;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::ggml_type::GgmlType;

/// The alignment of the data section and of every tensor offset when `general.alignment` is
/// absent (bytes; gguf.cpp `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The most dimensions a tensor may have (ggml `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// The deepest array nesting accepted (an array of arrays is depth 2). Real files use depth 1; the
/// limit keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Most entries reserved ahead of parsing for one count read from the file; vectors grow past it
/// only as entries are actually read.
const PREALLOC_MAX: usize = 1 << 16;

const MAGIC: &[u8; 4] = b"GGUF";
/// Smallest possible key/value pair: empty key (8) + type (4) + one-byte value (1).
const MIN_KV_BYTES: usize = 13;
/// Smallest possible tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 32;

/// Why a GGUF file was refused. Every variant names the key or tensor (or the header field) and
/// what was wrong with it; byte offsets are absolute positions in the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped (a directory is refused here too). The OS error is
    /// part of the message, not a separate error source, so a chained report names it once.
    #[error("cannot read GGUF file {path}: {error}")]
    Io {
        /// The path given to [`GgufFile::open`].
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The first four bytes are not `"GGUF"`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found (fewer than four when the file is that short).
        found: Vec<u8>,
    },
    /// The header `version` field is not 2 or 3.
    #[error("header field version is {version}; only GGUF v2 and v3 are supported")]
    UnsupportedVersion {
        /// The version read.
        version: u32,
    },
    /// The file ends before a field could be read.
    #[error("truncated GGUF: {what} needs {needed} bytes at offset {offset}, file has {file_len}")]
    Truncated {
        /// The field being read, naming its key or tensor (`"key \"general.name\" value"`).
        what: String,
        /// Where the field starts.
        offset: usize,
        /// Bytes the field needs.
        needed: u64,
        /// Total file length.
        file_len: usize,
    },
    /// A header count (`tensor_count` / `kv_count`) cannot fit in the bytes that follow.
    #[error(
        "header field {field} is {count}, but the remaining {remaining} bytes hold at most {max}"
    )]
    AbsurdCount {
        /// `"tensor_count"` or `"kv_count"`.
        field: &'static str,
        /// The count read.
        count: u64,
        /// The largest count the remaining bytes could hold.
        max: u64,
        /// Bytes after the header.
        remaining: usize,
    },
    /// A string's length field runs past the end of the file.
    #[error("{what}: string length {len} exceeds the {remaining} bytes left in the file")]
    StringTooLong {
        /// The string being read (a key name, a value, a tensor name), naming its key or tensor.
        what: String,
        /// The length read.
        len: u64,
        /// Bytes left after the length field.
        remaining: usize,
    },
    /// An array's element count cannot fit in the bytes left in the file.
    #[error(
        "key {key:?}: array of {count} {elem_type} elements needs at least {min_bytes} bytes, \
         {remaining} left in the file"
    )]
    ArrayTooLong {
        /// The key holding the array.
        key: String,
        /// The element count read.
        count: u64,
        /// The element type name.
        elem_type: &'static str,
        /// The least bytes those elements need (saturating).
        min_bytes: u64,
        /// Bytes left after the count field.
        remaining: usize,
    },
    /// Arrays nest deeper than [`MAX_ARRAY_DEPTH`].
    #[error("key {key:?}: arrays nested deeper than {max}")]
    ArrayTooDeep {
        /// The key holding the array.
        key: String,
        /// [`MAX_ARRAY_DEPTH`].
        max: usize,
    },
    /// A string is not valid UTF-8.
    #[error("{what}: string is not valid UTF-8 ({source})")]
    InvalidUtf8 {
        /// The string being read, naming its key or tensor.
        what: String,
        /// Where decoding failed.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A metadata value (or array element) type id is not one of the 13 GGUF types.
    #[error("key {key:?}: unknown metadata value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type id read.
        type_id: u32,
    },
    /// A bool value (or array element) is a byte other than 0 or 1.
    #[error("key {key:?}: bool at offset {offset} is byte {byte}, must be 0 or 1")]
    BadBool {
        /// The key.
        key: String,
        /// Absolute offset of the byte.
        offset: usize,
        /// The byte read.
        byte: u8,
    },
    /// The same key appears twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` is not an unsigned integer, or is zero or not a power of two.
    #[error("key \"general.alignment\": {reason}")]
    BadAlignment {
        /// What is wrong with it (names the value read).
        reason: String,
    },
    /// `n_dims` of a tensor is 0 or above [`MAX_DIMS`].
    #[error("tensor {tensor:?}: n_dims is {n_dims}, must be 1..={max}", max = MAX_DIMS)]
    BadDimCount {
        /// The tensor name.
        tensor: String,
        /// The n_dims read.
        n_dims: u32,
    },
    /// A dimension is zero, or so large that it is negative as the `int64_t` ggml stores.
    #[error("tensor {tensor:?}: ne[{dim}] is {value}, must be in 1..=2^63-1")]
    BadDim {
        /// The tensor name.
        tensor: String,
        /// Which dimension (ggml order).
        dim: usize,
        /// The value read.
        value: u64,
    },
    /// The product of the dimensions, or the byte size, overflows.
    #[error("tensor {tensor:?}: shape {ne:?} overflows when multiplied out")]
    ShapeOverflow {
        /// The tensor name.
        tensor: String,
        /// The dims, ggml order.
        ne: Vec<u64>,
    },
    /// The ggml type id is not one this reader knows.
    #[error("tensor {tensor:?}: unknown ggml type id {type_id}")]
    UnknownGgmlType {
        /// The tensor name.
        tensor: String,
        /// The type id read.
        type_id: u32,
    },
    /// Two tensors share a name.
    #[error("duplicate tensor name {tensor:?}")]
    DuplicateTensor {
        /// The tensor name.
        tensor: String,
    },
    /// `ne[0]` is not a multiple of the type's block size.
    #[error(
        "tensor {tensor:?}: row length ne[0] = {row_len} is not a multiple of the {ggml_type} \
         block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor name.
        tensor: String,
        /// ne[0].
        row_len: usize,
        /// The tensor type.
        ggml_type: GgmlType,
        /// Elements per block.
        block_size: usize,
    },
    /// The tensor's offset (relative to the data section) is not a multiple of the alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor name.
        tensor: String,
        /// The offset read, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: usize,
    },
    /// The tensor's data (type × shape bytes at its offset) does not lie inside the file.
    #[error(
        "tensor {tensor:?}: data of {n_bytes} bytes at offset {offset} (data section starts at \
         {data_start}) runs past the end of the {file_len}-byte file"
    )]
    DataOutOfBounds {
        /// The tensor name.
        tensor: String,
        /// The offset read, relative to the data section.
        offset: u64,
        /// Bytes the type and shape require.
        n_bytes: usize,
        /// Absolute start of the data section.
        data_start: usize,
        /// Total file length.
        file_len: usize,
    },
    /// Two tensors' data ranges overlap (one's type × shape is larger than the gap to the next).
    #[error(
        "tensor {tensor:?}: data [{start}, {end}) overlaps tensor {other:?} starting at {other_start}"
    )]
    OverlappingTensors {
        /// The tensor whose range runs into the next one.
        tensor: String,
        /// Its absolute start.
        start: usize,
        /// Its absolute end (exclusive).
        end: usize,
        /// The tensor it runs into.
        other: String,
        /// That tensor's absolute start.
        other_start: usize,
    },
}

/// The bytes of a GGUF file: a read-only map of a file, or an owned buffer.
enum Bytes {
    /// A read-only map of the file, and the file itself (for [`GgufFile::read_at`]).
    Mapped {
        map: Mmap,
        file: File,
    },
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, .. } => map,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed, validated GGUF v2/v3 file. Tensor data stays in the file's bytes (mapped or owned)
/// and is handed out as zero-copy slices. `Debug` prints a summary, not the contents.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("bytes", &self.bytes().len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses and validates it (see the module doc for the checks).
    ///
    /// Errors: [`GgufError::Io`] when the file cannot be opened or mapped; any other variant when
    /// its contents are refused.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        if path.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "it is a directory, not a .gguf file",
            )));
        }
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based model
        // loader (llama.cpp included) this assumes nobody truncates or rewrites the file while it
        // is open; all offsets into the map were validated against its length at parse time.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        GgufFile::parse(Bytes::Mapped { map, file })
    }

    /// Parses and validates an in-memory GGUF file, with the same checks as [`GgufFile::open`].
    ///
    /// Errors: any [`GgufError`] variant but `Io`.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Bytes::Owned(bytes))
    }

    /// The header version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the data section and of tensor offsets, in bytes: `general.alignment`, or
    /// [`DEFAULT_ALIGNMENT`] when the key is absent. Always a power of two.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute offset of the data section: the end of the tensor infos rounded up to the
    /// alignment (bytes). Tensor offsets are relative to it. A file without tensors may end before
    /// this offset (writers then omit the padding).
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// Every key/value pair, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of `key`, or `None` when the file lacks it.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Sets `key` to `value`, replacing its value in place or appending the pair, as llama.cpp's
    /// `--override-kv` does before a model's hyper-parameters are read. Tensor data and the
    /// file's bytes are unchanged.
    pub fn set_metadata(&mut self, key: &str, value: MetaValue) {
        match self.key_index.get(key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.key_index.insert(key.to_owned(), self.metadata.len());
                self.metadata.push((key.to_owned(), value));
            }
        }
    }

    /// Every tensor info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, or `None`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The `t.n_bytes` bytes of `t`'s data, zero-copy. `t` must come from this file (its range was
    /// validated at parse time); a `TensorInfo` from elsewhere whose range does not fit gets an
    /// empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        t.offset
            .checked_add(t.n_bytes)
            .and_then(|end| self.bytes().get(t.offset..end))
            .unwrap_or(&[])
    }

    /// Drops this process's resident pages of `view` (a slice of [`GgufFile::bytes`], e.g. an
    /// expert whose bytes the fast store has copied), so that a copy does not count twice in the
    /// resident set. Only whole pages inside `view` are released (`madvise(MADV_DONTNEED)` on the
    /// read-only file mapping): the bytes stay readable and are faulted back in from the file on
    /// the next read, unchanged. Returns the bytes released; 0 for an owned buffer, a view from
    /// elsewhere, or when the kernel refuses the advice (nothing is lost either way).
    pub fn release_pages(&self, view: &[u8]) -> usize {
        let Some((map, first, len)) = self.mapped_pages(view) else {
            return 0;
        };
        // SAFETY: the map is a read-only shared mapping of a file, so MADV_DONTNEED only drops
        // page-table entries; later reads fault the same file bytes back in. No `&mut` to these
        // bytes exists, and `[first, first + len)` lies inside the map.
        match unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, len) }
        {
            Ok(()) => len,
            Err(_) => 0,
        }
    }

    /// Maps this process's pages of `view` (a slice of [`GgufFile::bytes`]) now, reading them from
    /// the page cache or the file (`madvise(MADV_POPULATE_READ)`, Linux 5.14+), so that the first
    /// request does not fault them in one by one: the tensors every token reads in full. Only
    /// whole pages inside `view` are populated. Returns the bytes populated; 0 for an owned
    /// buffer, a view from elsewhere, another OS, or when the kernel refuses the advice (the
    /// pages are then faulted in on first read, as without it).
    pub fn populate_pages(&self, view: &[u8]) -> usize {
        let Some((map, first, len)) = self.mapped_pages(view) else {
            return 0;
        };
        #[cfg(target_os = "linux")]
        match map.advise_range(memmap2::Advice::PopulateRead, first, len) {
            Ok(()) => len,
            Err(_) => 0,
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (first, len);
            0
        }
    }

    /// Starts reading `view`'s pages (a slice of [`GgufFile::bytes`]) into the page cache
    /// (`madvise(MADV_WILLNEED)`: readahead, as llama.cpp's loader does for the whole file) without
    /// mapping them into this process, so that later reads of a few rows ([`GgufFile::read_at`])
    /// find them there instead of waiting on the disk. Only whole pages inside `view`. Returns
    /// the bytes advised; 0 for an owned buffer, a view from elsewhere, or when the kernel refuses
    /// the advice (the reads then go to the disk when they first need a page, as without it).
    pub fn prefetch_pages(&self, view: &[u8]) -> usize {
        let Some((map, first, len)) = self.mapped_pages(view) else {
            return 0;
        };
        match map.advise_range(memmap2::Advice::WillNeed, first, len) {
            Ok(()) => len,
            Err(_) => 0,
        }
    }

    /// Copies bytes `offset .. offset + out.len()` of `view` (a slice of [`GgufFile::bytes`])
    /// into `out` by reading the file (`pread`), not through the map, so that none of `view`'s
    /// pages becomes resident in this process (the page cache serves the read): how the
    /// executor reads rows of an embedding table. An owned buffer is copied.
    ///
    /// Errors: `InvalidInput` when `view` does not lie inside this file or the range does not
    /// lie inside `view`; the read's own I/O error (`UnexpectedEof` for a file truncated
    /// since it was opened).
    pub fn read_at(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        let all = self.bytes();
        let start = (view.as_ptr() as usize).wrapping_sub(all.as_ptr() as usize);
        let inside = start
            .checked_add(view.len())
            .is_some_and(|end| start <= all.len() && end <= all.len());
        let range = offset
            .checked_add(out.len())
            .filter(|&end| inside && end <= view.len())
            .map(|end| start + offset..start + end);
        let Some(range) = range else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "bytes {offset}..+{} of a {}-byte view are not inside the file",
                    out.len(),
                    view.len()
                ),
            ));
        };
        match &self.bytes {
            #[cfg(unix)]
            Bytes::Mapped { file, .. } => {
                use std::os::unix::fs::FileExt;
                file.read_exact_at(out, range.start as u64)
            }
            _ => {
                out.copy_from_slice(&all[range]);
                Ok(())
            }
        }
    }

    /// The map and the whole pages of `view` inside it (offset, length), for the page advice
    /// above; None for an owned buffer or a view with no whole page in the map.
    fn mapped_pages(&self, view: &[u8]) -> Option<(&Mmap, usize, usize)> {
        let Bytes::Mapped { map, .. } = &self.bytes else {
            return None;
        };
        let (first, len) = whole_pages(map.as_ptr() as usize, map.len(), view)?;
        Some((map, first, len))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    fn parse(bytes: Bytes) -> Result<GgufFile, GgufError> {
        let header = parse_header(bytes.as_slice())?;
        Ok(GgufFile {
            bytes,
            version: header.version,
            alignment: header.alignment,
            data_start: header.data_start,
            metadata: header.metadata,
            key_index: header.key_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
        })
    }
}

/// One tensor of a GGUF file, validated: 1..=4 dims, each nonzero, `ne[0]` a multiple of the block
/// size, data `[offset, offset + n_bytes)` inside the file and aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name (`"blk.0.attn_q_a.weight"`).
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is the fastest-varying (the row length), 1..=4 entries.
    pub ne: Vec<usize>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file (data section start + the stored offset).
    pub offset: usize,
    /// Bytes of data: `row_size(ne[0]) × ne[1] × ne[2] × ne[3]`.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Product of all dims (elements).
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    /// `ne[0]`, elements per row.
    pub fn row_len(&self) -> usize {
        self.ne.first().copied().unwrap_or(0)
    }

    /// Rows: the product of `ne[1..]` (1 for a vector).
    pub fn n_rows(&self) -> usize {
        self.ne.iter().skip(1).product()
    }

    /// Bytes of one row (ggml `ggml_row_size(type, ne[0])`).
    pub fn row_bytes(&self) -> usize {
        self.ggml_type.row_size(self.row_len()).unwrap_or(0)
    }
}

/// A metadata value. Type ids (gguf-py `GGUFValueType`): 0 U8, 1 I8, 2 U16, 3 I16, 4 U32, 5 I32,
/// 6 F32, 7 Bool, 8 String, 9 Array, 10 U64, 11 I64, 12 F64.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1; any other byte is refused).
    Bool(bool),
    /// Type 8 (UTF-8).
    String(String),
    /// Type 9.
    Array(MetaArray),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetaValue {
    /// Any integer type holding a non-negative value, as `u64`; `None` for negatives and
    /// non-integers.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits `i64`; `None` otherwise.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// F32, F64 (rounded to f32) and integers (converted, rounding large ones); `None` otherwise.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => self
                .as_i64()
                .map(|v| v as f32)
                .or_else(|| self.as_u64().map(|v| v as f32)),
        }
    }

    /// The value of a Bool; `None` for every other type.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The text of a String; `None` for every other type.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array of strings; `None` for every other type.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetaValue::Array(MetaArray::String(v)) => Some(v),
            _ => None,
        }
    }

    /// The array, whatever its element type; `None` for a scalar.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF type name (`"u32"`, `"string"`, `"array"`, ...), as gguf-py spells them in lower
    /// case.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }
}

/// A metadata array, stored compactly by element type (the tekken vocab holds 131072 strings and
/// 269443 merges; one `Vec<String>` each, not a `Vec<MetaValue>`).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    /// Element type 0.
    U8(Vec<u8>),
    /// Element type 1.
    I8(Vec<i8>),
    /// Element type 2.
    U16(Vec<u16>),
    /// Element type 3.
    I16(Vec<i16>),
    /// Element type 4.
    U32(Vec<u32>),
    /// Element type 5.
    I32(Vec<i32>),
    /// Element type 6.
    F32(Vec<f32>),
    /// Element type 7.
    Bool(Vec<bool>),
    /// Element type 8.
    String(Vec<String>),
    /// Element type 9: an array of arrays (each inner array has its own element type).
    Nested(Vec<MetaArray>),
    /// Element type 10.
    U64(Vec<u64>),
    /// Element type 11.
    I64(Vec<i64>),
    /// Element type 12.
    F64(Vec<f64>),
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Nested(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type name (`"i32"`, `"string"`, `"array"`), spelled as [`MetaValue::type_name`].
    pub fn elem_type_name(&self) -> &'static str {
        ValueType::of_array(self).name()
    }

    /// Element `i` as a [`MetaValue`] (strings and nested arrays are cloned), or `None` past the
    /// end.
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        Some(match self {
            MetaArray::U8(v) => MetaValue::U8(*v.get(i)?),
            MetaArray::I8(v) => MetaValue::I8(*v.get(i)?),
            MetaArray::U16(v) => MetaValue::U16(*v.get(i)?),
            MetaArray::I16(v) => MetaValue::I16(*v.get(i)?),
            MetaArray::U32(v) => MetaValue::U32(*v.get(i)?),
            MetaArray::I32(v) => MetaValue::I32(*v.get(i)?),
            MetaArray::F32(v) => MetaValue::F32(*v.get(i)?),
            MetaArray::Bool(v) => MetaValue::Bool(*v.get(i)?),
            MetaArray::String(v) => MetaValue::String(v.get(i)?.clone()),
            MetaArray::Nested(v) => MetaValue::Array(v.get(i)?.clone()),
            MetaArray::U64(v) => MetaValue::U64(*v.get(i)?),
            MetaArray::I64(v) => MetaValue::I64(*v.get(i)?),
            MetaArray::F64(v) => MetaValue::F64(*v.get(i)?),
        })
    }

    /// The elements in order, each as [`MetaArray::get`] returns it. For strings prefer
    /// [`MetaValue::as_strings`], which borrows.
    pub fn iter(&self) -> impl Iterator<Item = MetaValue> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

/// GGUF metadata value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    fn of_array(a: &MetaArray) -> ValueType {
        match a {
            MetaArray::U8(_) => ValueType::U8,
            MetaArray::I8(_) => ValueType::I8,
            MetaArray::U16(_) => ValueType::U16,
            MetaArray::I16(_) => ValueType::I16,
            MetaArray::U32(_) => ValueType::U32,
            MetaArray::I32(_) => ValueType::I32,
            MetaArray::F32(_) => ValueType::F32,
            MetaArray::Bool(_) => ValueType::Bool,
            MetaArray::String(_) => ValueType::String,
            MetaArray::Nested(_) => ValueType::Array,
            MetaArray::U64(_) => ValueType::U64,
            MetaArray::I64(_) => ValueType::I64,
            MetaArray::F64(_) => ValueType::F64,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// The fewest bytes one element of this type occupies (a string is at least its length
    /// field, an array at least its type and count fields).
    fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let slice = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or_else(|| GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n as u64,
                file_len: self.buf.len(),
            })?;
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A gguf string: `u64` length, then that many UTF-8 bytes. The length is checked against the
    /// remaining bytes before the string is allocated.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("{} length", what()))?;
        let remaining = self.remaining();
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n <= remaining)
            .ok_or_else(|| GgufError::StringTooLong {
                what: what(),
                len,
                remaining,
            })?;
        let raw = self.take(n, what)?;
        let text = std::str::from_utf8(raw).map_err(|source| GgufError::InvalidUtf8 {
            what: what(),
            source,
        })?;
        Ok(text.to_owned())
    }
}

/// Everything [`GgufFile`] holds besides the bytes.
struct Header {
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    match buf.get(..4) {
        Some(m) if m == MAGIC => c.pos = 4,
        _ => {
            return Err(GgufError::BadMagic {
                found: buf.iter().take(4).copied().collect(),
            })
        }
    }
    let version = c.u32(&|| "header field version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count = c.u64(&|| "header field tensor_count".into())?;
    let kv_count = c.u64(&|| "header field kv_count".into())?;
    let remaining = c.remaining();
    check_count("kv_count", kv_count, MIN_KV_BYTES, remaining)?;
    check_count(
        "tensor_count",
        tensor_count,
        MIN_TENSOR_INFO_BYTES,
        remaining,
    )?;
    let kv_bytes = kv_count.saturating_mul(MIN_KV_BYTES as u64);
    let tensor_bytes = tensor_count.saturating_mul(MIN_TENSOR_INFO_BYTES as u64);
    if kv_bytes.saturating_add(tensor_bytes) > remaining as u64 {
        // Each count fits alone but not both together: blame the tensors, which come last.
        let max = (remaining as u64).saturating_sub(kv_bytes) / MIN_TENSOR_INFO_BYTES as u64;
        return Err(GgufError::AbsurdCount {
            field: "tensor_count",
            count: tensor_count,
            max,
            remaining,
        });
    }
    // Both counts are now bounded by the file length, so they fit usize.
    let kv_count = kv_count as usize;
    let tensor_count = tensor_count as usize;

    let mut metadata = Vec::with_capacity(kv_count.min(PREALLOC_MAX));
    let mut key_index = HashMap::with_capacity(kv_count.min(PREALLOC_MAX));
    for i in 0..kv_count {
        let key = c.string(&|| format!("key #{i} name"))?;
        let type_id = c.u32(&|| format!("key {key:?} value type"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = read_value(&mut c, &key, ty)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let value = &metadata[i].1;
            let a = value.as_u64().ok_or_else(|| GgufError::BadAlignment {
                reason: format!(
                    "value of type {} is not an unsigned integer",
                    value.type_name()
                ),
            })?;
            match usize::try_from(a) {
                Ok(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::BadAlignment {
                        reason: format!("{a} is not a nonzero power of two"),
                    })
                }
            }
        }
    };

    let mut raw_tensors = Vec::with_capacity(tensor_count.min(PREALLOC_MAX));
    let mut tensor_index = HashMap::with_capacity(tensor_count.min(PREALLOC_MAX));
    for i in 0..tensor_count {
        let raw = read_tensor_info(&mut c, i)?;
        if tensor_index.insert(raw.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor { tensor: raw.name });
        }
        raw_tensors.push(raw);
    }

    let header_end = c.pos;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .unwrap_or(usize::MAX);
    let tensors = raw_tensors
        .into_iter()
        .map(|raw| place_tensor(raw, alignment, data_start, buf.len()))
        .collect::<Result<Vec<_>, _>>()?;
    check_overlaps(&tensors)?;

    Ok(Header {
        version,
        alignment,
        data_start,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

fn check_count(
    field: &'static str,
    count: u64,
    min_each: usize,
    remaining: usize,
) -> Result<(), GgufError> {
    let max = remaining as u64 / min_each as u64;
    if count > max {
        return Err(GgufError::AbsurdCount {
            field,
            count,
            max,
            remaining,
        });
    }
    Ok(())
}

fn read_value(c: &mut Cursor<'_>, key: &str, ty: ValueType) -> Result<MetaValue, GgufError> {
    let what = || format!("key {key:?} value");
    Ok(match ty {
        ValueType::U8 => MetaValue::U8(c.u8(&what)?),
        ValueType::I8 => MetaValue::I8(i8::from_le_bytes(c.array(&what)?)),
        ValueType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => MetaValue::U32(c.u32(&what)?),
        ValueType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => MetaValue::Bool(read_bool(c, key)?),
        ValueType::String => MetaValue::String(c.string(&what)?),
        ValueType::Array => MetaValue::Array(read_array(c, key, 1)?),
        ValueType::U64 => MetaValue::U64(c.u64(&what)?),
        ValueType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
    })
}

fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    let start = c.pos;
    match c.u8(&|| format!("key {key:?} bool value"))? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(GgufError::BadBool {
            key: key.to_owned(),
            offset: start,
            byte: b,
        }),
    }
}

/// Reads `count` fixed-size elements after checking they fit.
fn read_fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    key: &str,
    count: usize,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let raw = c.take(count.saturating_mul(N), &|| {
        format!("key {key:?} array elements")
    })?;
    Ok(raw
        .chunks_exact(N)
        .map(|chunk| {
            let mut a = [0u8; N];
            a.copy_from_slice(chunk);
            decode(a)
        })
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetaArray, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let type_id = c.u32(&|| format!("key {key:?} array element type"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        type_id,
    })?;
    let count = c.u64(&|| format!("key {key:?} array count"))?;
    let remaining = c.remaining();
    let min_bytes = count.saturating_mul(ty.min_size());
    if min_bytes > remaining as u64 {
        return Err(GgufError::ArrayTooLong {
            key: key.to_owned(),
            count,
            elem_type: ty.name(),
            min_bytes,
            remaining,
        });
    }
    // Bounded by the remaining bytes, so it fits usize.
    let n = count as usize;
    Ok(match ty {
        ValueType::U8 => MetaArray::U8(read_fixed(c, key, n, u8::from_le_bytes)?),
        ValueType::I8 => MetaArray::I8(read_fixed(c, key, n, i8::from_le_bytes)?),
        ValueType::U16 => MetaArray::U16(read_fixed(c, key, n, u16::from_le_bytes)?),
        ValueType::I16 => MetaArray::I16(read_fixed(c, key, n, i16::from_le_bytes)?),
        ValueType::U32 => MetaArray::U32(read_fixed(c, key, n, u32::from_le_bytes)?),
        ValueType::I32 => MetaArray::I32(read_fixed(c, key, n, i32::from_le_bytes)?),
        ValueType::F32 => MetaArray::F32(read_fixed(c, key, n, f32::from_le_bytes)?),
        ValueType::U64 => MetaArray::U64(read_fixed(c, key, n, u64::from_le_bytes)?),
        ValueType::I64 => MetaArray::I64(read_fixed(c, key, n, i64::from_le_bytes)?),
        ValueType::F64 => MetaArray::F64(read_fixed(c, key, n, f64::from_le_bytes)?),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(n.min(PREALLOC_MAX));
            for _ in 0..n {
                v.push(read_bool(c, key)?);
            }
            MetaArray::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n.min(PREALLOC_MAX));
            for j in 0..n {
                v.push(c.string(&|| format!("key {key:?} array element {j}"))?);
            }
            MetaArray::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n.min(PREALLOC_MAX));
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            MetaArray::Nested(v)
        }
    })
}

/// A tensor info as read, before its offset is placed in the file.
struct RawTensor {
    name: String,
    ne: Vec<usize>,
    ggml_type: GgmlType,
    rel_offset: u64,
    n_bytes: usize,
}

fn read_tensor_info(c: &mut Cursor<'_>, i: usize) -> Result<RawTensor, GgufError> {
    let name = c.string(&|| format!("tensor #{i} name"))?;
    let n_dims = c.u32(&|| format!("tensor {name:?} n_dims"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name,
            n_dims,
        });
    }
    let mut raw_ne = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims as usize {
        raw_ne.push(c.u64(&|| format!("tensor {name:?} ne[{d}]"))?);
    }
    let type_id = c.u32(&|| format!("tensor {name:?} ggml type"))?;
    let rel_offset = c.u64(&|| format!("tensor {name:?} offset"))?;

    let mut ne = Vec::with_capacity(raw_ne.len());
    for (dim, &value) in raw_ne.iter().enumerate() {
        if value == 0 || value > i64::MAX as u64 {
            return Err(GgufError::BadDim {
                tensor: name,
                dim,
                value,
            });
        }
        let v = usize::try_from(value).map_err(|_| GgufError::ShapeOverflow {
            tensor: name.clone(),
            ne: raw_ne.clone(),
        })?;
        ne.push(v);
    }
    let overflow = || GgufError::ShapeOverflow {
        tensor: name.clone(),
        ne: raw_ne.clone(),
    };
    // ggml keeps element counts in int64_t; refuse anything past that too.
    let n_elements = ne
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n as u64 <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
        tensor: name.clone(),
        type_id,
    })?;
    let row_len = ne[0];
    if !row_len.is_multiple_of(ggml_type.block_size()) {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: name,
            row_len,
            ggml_type,
            block_size: ggml_type.block_size(),
        });
    }
    let n_bytes = ggml_type
        .row_size(row_len)
        .and_then(|row| row.checked_mul(n_elements / row_len))
        .ok_or_else(overflow)?;
    Ok(RawTensor {
        name,
        ne,
        ggml_type,
        rel_offset,
        n_bytes,
    })
}

fn place_tensor(
    raw: RawTensor,
    alignment: usize,
    data_start: usize,
    file_len: usize,
) -> Result<TensorInfo, GgufError> {
    if !raw.rel_offset.is_multiple_of(alignment as u64) {
        return Err(GgufError::MisalignedOffset {
            tensor: raw.name,
            offset: raw.rel_offset,
            alignment,
        });
    }
    let offset = usize::try_from(raw.rel_offset)
        .ok()
        .and_then(|rel| data_start.checked_add(rel))
        .filter(|&start| {
            start
                .checked_add(raw.n_bytes)
                .is_some_and(|end| end <= file_len)
        })
        .ok_or_else(|| GgufError::DataOutOfBounds {
            tensor: raw.name.clone(),
            offset: raw.rel_offset,
            n_bytes: raw.n_bytes,
            data_start,
            file_len,
        })?;
    Ok(TensorInfo {
        name: raw.name,
        ne: raw.ne,
        ggml_type: raw.ggml_type,
        offset,
        n_bytes: raw.n_bytes,
    })
}

/// Sorts the data ranges by start and refuses any range that runs into the next one.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let end = a.offset + a.n_bytes;
        if end > b.offset {
            return Err(GgufError::OverlappingTensors {
                tensor: a.name.clone(),
                start: a.offset,
                end,
                other: b.name.clone(),
                other_start: b.offset,
            });
        }
    }
    Ok(())
}

/// The whole pages of `view` inside a map of `len` bytes at address `base`: `(offset in the map,
/// bytes)`, or None when `view` is empty, lies outside the map or holds no whole page.
fn whole_pages(base: usize, len: usize, view: &[u8]) -> Option<(usize, usize)> {
    let start = (view.as_ptr() as usize).wrapping_sub(base);
    if view.is_empty() || start >= len || start + view.len() > len {
        return None;
    }
    let page = page_size();
    let first = start.div_ceil(page) * page;
    let end = (start + view.len()) / page * page;
    (end > first).then(|| (first, end - first))
}

/// The size of a memory page in bytes (`sysconf(_SC_PAGESIZE)`; 4096 if it cannot be read).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    //! Every fixture parses; counts, shapes and types agree with the fixture READMEs and with
    //! PyPI gguf 0.19.0 `GGUFReader` (numbers noted where they come from it).
    use super::*;
    use std::path::PathBuf;

    fn data(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data")
            .join(rel)
    }

    fn bundled_q2k() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf")
    }

    fn open(path: &Path) -> GgufFile {
        GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The file's largest tensor.
    fn largest(f: &GgufFile) -> &TensorInfo {
        f.tensors()
            .iter()
            .max_by_key(|t| t.n_bytes)
            .expect("a tensor")
    }

    /// Released pages read back the file's bytes; only whole pages inside the view are released
    /// (and populated); views from elsewhere and owned buffers release and populate nothing.
    #[test]
    fn release_pages_keeps_the_bytes() {
        let path = bundled_q2k();
        let f = open(&path);
        let t = largest(&f);
        let view = f.tensor_data(t);
        let before = view.to_vec();
        let page = page_size();
        assert!(view.len() > 2 * page, "{} bytes", view.len());
        let released = f.release_pages(view);
        assert!(released > 0 && released <= view.len() && released.is_multiple_of(page));
        assert_eq!(f.tensor_data(t), &before[..]);
        assert_eq!(f.release_pages(&before), 0);
        assert_eq!(f.release_pages(&view[..1]), 0);
        let owned = GgufFile::from_bytes(std::fs::read(&path).expect("read")).expect("parse");
        assert_eq!(owned.release_pages(owned.tensor_data(t)), 0);
        // Populating maps the same whole pages back, bytes unchanged; nothing outside the map.
        if cfg!(target_os = "linux") {
            assert_eq!(f.populate_pages(view), released);
        }
        assert_eq!(f.tensor_data(t), &before[..]);
        assert_eq!(f.populate_pages(&before), 0);
        assert_eq!(owned.populate_pages(owned.tensor_data(t)), 0);
    }

    /// `read_at` copies the view's bytes from the file (mapped) or the buffer (owned), and
    /// refuses a range outside the view and a view from elsewhere; `prefetch_pages` advises the
    /// view's whole pages of a mapped file only.
    #[test]
    fn read_at_copies_the_view_and_checks_its_range() {
        let path = bundled_q2k();
        let mapped = open(&path);
        let owned = GgufFile::from_bytes(std::fs::read(&path).expect("read")).expect("parse");
        for f in [&mapped, &owned] {
            let t = largest(f);
            let view = f.tensor_data(t);
            let mut out = vec![0u8; 1000];
            f.read_at(view, 123, &mut out).expect("inside the view");
            assert_eq!(out, &view[123..1123]);
            let mut all = vec![0u8; view.len()];
            f.read_at(view, 0, &mut all).expect("the whole view");
            assert_eq!(all, view);
            let end = view.len() - 999;
            let refused = |r: std::io::Result<()>| {
                r.expect_err("outside").kind() == std::io::ErrorKind::InvalidInput
            };
            assert!(refused(f.read_at(view, end, &mut out)));
            assert!(refused(f.read_at(view, usize::MAX, &mut out)));
            let elsewhere = view.to_vec();
            assert!(refused(f.read_at(&elsewhere, 0, &mut out)));
        }
        let t = largest(&mapped);
        let view = mapped.tensor_data(t);
        let advised = mapped.prefetch_pages(view);
        assert!(advised > 0 && advised <= view.len() && advised.is_multiple_of(page_size()));
        assert_eq!(owned.prefetch_pages(owned.tensor_data(t)), 0);
        let elsewhere = view.to_vec();
        assert_eq!(mapped.prefetch_pages(&elsewhere), 0);
    }

    /// The data of every tensor lies back to back, each start aligned, in the order the writers
    /// (gguf-py and llama.cpp) lay them out, with the file ending at the padded end of the last.
    fn assert_packed(f: &GgufFile) {
        let mut order: Vec<&TensorInfo> = f.tensors().iter().collect();
        order.sort_by_key(|t| t.offset);
        let mut expected = f.data_start();
        for t in order {
            assert_eq!(t.offset, expected, "tensor {}", t.name);
            assert_eq!(f.tensor_data(t).len(), t.n_bytes);
            assert_eq!(t.n_bytes, t.row_bytes() * t.n_rows(), "tensor {}", t.name);
            expected = (t.offset + t.n_bytes).next_multiple_of(f.alignment());
        }
        if !f.tensors().is_empty() {
            assert_eq!(f.bytes().len(), expected);
        }
    }

    #[test]
    fn tekken_vocab_matches_readme() {
        let f = open(&data("tokenizer/tekken-v15-vocab.gguf"));
        assert_eq!(f.version(), 3);
        assert_eq!(f.bytes().len(), 7_873_416);
        assert_eq!(f.metadata().len(), 47);
        assert!(f.tensors().is_empty());
        assert_eq!(f.alignment(), 32);
        let tokens = f
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_strings);
        assert_eq!(tokens.map(<[String]>::len), Some(131_072));
        assert_eq!(
            tokens.and_then(|t| t.get(1)).map(String::as_str),
            Some("<s>")
        );
        let merges = f
            .get("tokenizer.ggml.merges")
            .and_then(MetaValue::as_strings);
        assert_eq!(merges.map(<[String]>::len), Some(269_443));
        let types = f
            .get("tokenizer.ggml.token_type")
            .and_then(MetaValue::as_array);
        assert_eq!(types.map(MetaArray::elem_type_name), Some("i32"));
        assert_eq!(types.and_then(|a| a.get(999)), Some(MetaValue::I32(3)));
        assert_eq!(types.and_then(|a| a.get(1000)), Some(MetaValue::I32(1)));
        let get_u64 = |k: &str| f.get(k).and_then(MetaValue::as_u64);
        assert_eq!(get_u64("tokenizer.ggml.bos_token_id"), Some(1));
        assert_eq!(get_u64("mistral4.block_count"), Some(36));
        assert_eq!(get_u64("mistral4.attention.key_length"), Some(320));
        assert_eq!(get_u64("mistral4.vocab_size"), Some(131_072));
        assert_eq!(
            f.get("general.architecture").and_then(MetaValue::as_str),
            Some("mistral4")
        );
        assert_eq!(
            f.get("tokenizer.ggml.pre").and_then(MetaValue::as_str),
            Some("tekken")
        );
    }

    #[test]
    fn quant_vectors_match_readme() {
        let f = open(&data("quants/quant_vectors.gguf"));
        assert_eq!(f.version(), 3);
        assert_eq!(f.bytes().len(), 627_200);
        assert_eq!(f.metadata().len(), 8);
        let types = f
            .get("quant_vectors.types")
            .and_then(MetaValue::as_strings)
            .expect("quant_vectors.types");
        assert_eq!(types.len(), 26);
        assert_eq!(f.tensors().len(), 52);
        for (i, name) in types.iter().enumerate() {
            let ty = GgmlType::from_name(name).expect("known type");
            let ne0 = if ty.block_size() == 1 {
                256
            } else {
                4 * ty.block_size()
            };
            let q = &f.tensors()[2 * i];
            let r = &f.tensors()[2 * i + 1];
            assert_eq!(q.name, format!("q.{name}"));
            assert_eq!(r.name, format!("ref.{name}"));
            assert_eq!((q.ggml_type, r.ggml_type), (ty, GgmlType::F32));
            assert_eq!(q.ne, vec![ne0, 8]);
            assert_eq!(r.ne, q.ne);
            assert_eq!(q.row_len(), ne0);
            assert_eq!(q.n_rows(), 8);
            assert_eq!(q.n_elements(), ne0 * 8);
            assert_eq!(q.n_bytes, 8 * ne0 / ty.block_size() * ty.type_size());
        }
        // gguf-py GGUFReader: 276480 elements in all, data section at 3296.
        let total: usize = f.tensors().iter().map(TensorInfo::n_elements).sum();
        assert_eq!(total, 276_480);
        assert_eq!(f.data_start(), 3296);
        assert_packed(&f);
    }

    #[test]
    fn models_match_readme() {
        let cases = [
            (
                data("models/ms4-tiny-f32.gguf"),
                12_104_160,
                51,
                51,
                2_940_160,
            ),
            (
                data("models/ms4-tiny-f32-split.gguf"),
                12_104_352,
                51,
                54,
                2_940_160,
            ),
            (bundled_q2k(), 6_634_848, 51, 51, 14_653_760),
            (
                data("models/ms4-tiny256-iq2xxs.gguf"),
                5_299_968,
                55,
                51,
                14_653_760,
            ),
        ];
        for (path, len, n_kv, n_tensors, n_params) in cases {
            let f = open(&path);
            assert_eq!(f.bytes().len(), len, "{}", path.display());
            assert_eq!(f.metadata().len(), n_kv, "{}", path.display());
            assert_eq!(f.tensors().len(), n_tensors, "{}", path.display());
            let total: usize = f.tensors().iter().map(TensorInfo::n_elements).sum();
            assert_eq!(total, n_params, "{}", path.display());
            assert_eq!(
                f.get("general.architecture").and_then(MetaValue::as_str),
                Some("mistral4")
            );
            assert_packed(&f);
        }
    }

    #[test]
    fn quantized_models_have_readme_types() {
        let q2k = open(&bundled_q2k());
        let iq2 = open(&data("models/ms4-tiny256-iq2xxs.gguf"));
        let ty = |f: &GgufFile, name: &str| f.tensor(name).map(|t| t.ggml_type);
        use GgmlType::*;
        let table = [
            (
                "blk.0.ffn_gate_up_exps.weight",
                Q2_K,
                IQ2_XXS,
                vec![256, 512, 16],
            ),
            (
                "blk.1.ffn_down_exps.weight",
                Q3_K,
                IQ2_XXS,
                vec![256, 256, 16],
            ),
            ("blk.2.ffn_down_shexp.weight", Q3_K, IQ2_XXS, vec![256, 256]),
            ("blk.0.attn_kv_a_mqa.weight", Q2_K, IQ2_XXS, vec![256, 96]),
            ("blk.0.attn_k_b.weight", Q4_0, IQ4_NL, vec![32, 64, 4]),
            ("blk.0.attn_v_b.weight", Q4_0, IQ4_NL, vec![64, 32, 4]),
            ("token_embd.weight", Q2_K, Q2_K, vec![256, 8192]),
            ("output.weight", Q6_K, Q5_K, vec![256, 8192]),
            ("blk.0.ffn_gate_inp.weight", F32, F32, vec![256, 16]),
        ];
        for (name, t_q2k, t_iq2, ne) in table {
            assert_eq!(ty(&q2k, name), Some(t_q2k), "{name}");
            assert_eq!(ty(&iq2, name), Some(t_iq2), "{name}");
            assert_eq!(q2k.tensor(name).map(|t| &t.ne), Some(&ne), "{name}");
        }
    }

    #[test]
    fn from_bytes_equals_open() {
        let path = data("quants/quant_vectors.gguf");
        let mapped = open(&path);
        let owned = GgufFile::from_bytes(std::fs::read(&path).expect("read")).expect("parse");
        assert_eq!(mapped.metadata(), owned.metadata());
        assert_eq!(mapped.tensors(), owned.tensors());
        for t in owned.tensors() {
            assert_eq!(owned.tensor_data(t), mapped.tensor_data(t));
        }
    }

    #[test]
    fn meta_value_conversions() {
        assert_eq!(MetaValue::I32(-1).as_u64(), None);
        assert_eq!(MetaValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U8(3).as_f32(), Some(3.0));
        assert_eq!(MetaValue::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(MetaValue::F32(1.0).as_u64(), None);
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::String("x".into()).as_bool(), None);
        assert_eq!(MetaValue::U16(1).type_name(), "u16");
    }
}
