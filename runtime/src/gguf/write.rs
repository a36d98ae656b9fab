//! A GGUF v3 writer: in memory for small and hostile test files (any header field, type id, count
//! or offset can be set by hand), and streamed for large ones (`aubier synth`'s multi-GB files are
//! never held in memory).
//!
//! Layout written (gguf-py `gguf/gguf_writer.py`, llama.cpp `ggml/src/gguf.cpp`): magic, version,
//! tensor_count, kv_count, the key/value pairs in insertion order, the tensor infos in insertion
//! order, zero padding to `alignment`, then the data section. In memory ([`GgufWriter::finish`]),
//! each tensor's data goes at its explicit offset or, if none, at the next aligned offset after the
//! data written so far; the data section ends at the padded end of the last data written (a tensor
//! with empty data and an explicit offset occupies nothing, so a hostile offset of 2^40 costs no
//! memory). A file without tensors ends right after the last key/value pair (as llama.cpp's
//! `--vocab-only` writer does). Streamed ([`GgufWriter::write_streamed`]), tensors are laid out
//! back to back at aligned offsets and their bytes come from a callback, one tensor at a time.

use crate::ggml_type::GgmlType;
use crate::gguf::{GgufFile, MetaArray, MetaValue};
use std::io::{self, Write};

/// GGUF value type ids (gguf-py `GGUFValueType`).
pub mod value_type {
    /// `UINT8`.
    pub const U8: u32 = 0;
    /// `INT8`.
    pub const I8: u32 = 1;
    /// `UINT16`.
    pub const U16: u32 = 2;
    /// `INT16`.
    pub const I16: u32 = 3;
    /// `UINT32`.
    pub const U32: u32 = 4;
    /// `INT32`.
    pub const I32: u32 = 5;
    /// `FLOAT32`.
    pub const F32: u32 = 6;
    /// `BOOL`.
    pub const BOOL: u32 = 7;
    /// `STRING`.
    pub const STRING: u32 = 8;
    /// `ARRAY`.
    pub const ARRAY: u32 = 9;
    /// `UINT64`.
    pub const U64: u32 = 10;
    /// `INT64`.
    pub const I64: u32 = 11;
    /// `FLOAT64`.
    pub const F64: u32 = 12;
}

/// One tensor info to write.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    /// Name bytes (need not be UTF-8).
    pub name: Vec<u8>,
    /// `ne` in ggml order, written as given (any count, any values).
    pub ne: Vec<u64>,
    /// ggml type id, written as given.
    pub type_id: u32,
    /// Offset relative to the data section; `None` = next aligned offset after the data so far.
    pub offset: Option<u64>,
    /// Bytes copied to the tensor's offset in the data section (may differ from type × shape).
    pub data: Vec<u8>,
}

/// A GGUF file under construction. Public fields override what is written in the header.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    /// The four magic bytes (`b"GGUF"`).
    pub magic: [u8; 4],
    /// Header version (3).
    pub version: u32,
    /// Written instead of the real tensor count when set.
    pub tensor_count: Option<u64>,
    /// Written instead of the real key/value count when set.
    pub kv_count: Option<u64>,
    /// Alignment used to lay out the data section (bytes; 32). It does not write
    /// `general.alignment`: add that key yourself.
    pub alignment: usize,
    kvs: Vec<Vec<u8>>,
    /// The tensor infos, in file order.
    pub tensors: Vec<TensorSpec>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// An empty v3 file with alignment 32.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Appends a key/value pair encoded from `value`.
    pub fn kv(&mut self, key: &str, value: &MetaValue) -> &mut Self {
        let (type_id, payload) = encode_value(value);
        self.kv_raw(key.as_bytes(), type_id, &payload)
    }

    /// Appends a key/value pair from raw parts: key bytes, value type id, and the value's bytes
    /// exactly as they should appear after the type id.
    pub fn kv_raw(&mut self, key: &[u8], type_id: u32, payload: &[u8]) -> &mut Self {
        let mut kv = gguf_string(key);
        kv.extend_from_slice(&type_id.to_le_bytes());
        kv.extend_from_slice(payload);
        self.kvs.push(kv);
        self
    }

    /// Appends a tensor whose data goes at the next aligned offset.
    pub fn tensor(&mut self, name: &str, ne: &[u64], type_id: u32, data: &[u8]) -> &mut Self {
        self.tensors.push(TensorSpec {
            name: name.as_bytes().to_vec(),
            ne: ne.to_vec(),
            type_id,
            offset: None,
            data: data.to_vec(),
        });
        self
    }

    /// The file bytes.
    pub fn finish(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        let n_tensors = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        let n_kv = self.kv_count.unwrap_or(self.kvs.len() as u64);
        out.extend_from_slice(&n_tensors.to_le_bytes());
        out.extend_from_slice(&n_kv.to_le_bytes());
        for kv in &self.kvs {
            out.extend_from_slice(kv);
        }
        let align = self.alignment as u64;
        let mut next = 0u64;
        let mut section_len = 0u64;
        let mut placed = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let offset = t.offset.unwrap_or(next);
            if !t.data.is_empty() {
                let end = (offset + t.data.len() as u64).next_multiple_of(align);
                next = next.max(end);
                section_len = section_len.max(end);
            }
            placed.push(offset);
            out.extend_from_slice(&gguf_string(&t.name));
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        if self.tensors.is_empty() {
            return out;
        }
        out.resize(out.len().next_multiple_of(self.alignment), 0);
        let data_start = out.len();
        out.resize(data_start + section_len as usize, 0);
        for (t, offset) in self.tensors.iter().zip(placed) {
            if t.data.is_empty() {
                continue;
            }
            let at = data_start + offset as usize;
            out[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        out
    }

    /// A writer holding every key/value pair and tensor of `file` (offsets and data included), so
    /// that `finish()` reproduces a file laid out as gguf-py / llama.cpp lay them out.
    pub fn from_file(file: &GgufFile) -> GgufWriter {
        let mut w = GgufWriter {
            version: file.version(),
            alignment: file.alignment(),
            ..GgufWriter::default()
        };
        for (key, value) in file.metadata() {
            w.kv(key, value);
        }
        w.tensors = tensor_specs(file);
        w
    }
}

/// A tensor of a streamed file: its info only; the bytes come from the callback of
/// [`GgufWriter::write_streamed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamedTensor {
    /// GGUF tensor name (`"blk.0.attn_q_a.weight"`).
    pub name: String,
    /// `ne` in ggml order (`ne[0]` is the row length).
    pub ne: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
}

impl StreamedTensor {
    /// Bytes of the tensor's data: rows × `ggml_row_size(ne[0])`, or `None` when `ne` is empty,
    /// `ne[0]` is not a multiple of the block size, or the size overflows.
    pub fn n_bytes(&self) -> Option<u64> {
        let (&row, rest) = self.ne.split_first()?;
        let row_bytes = self.ggml_type.row_size(usize::try_from(row).ok()?)? as u64;
        rest.iter()
            .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
    }
}

/// What [`GgufWriter::write_streamed`] can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    /// Writing to the sink, or the callback, failed.
    #[error("writing the GGUF file: {0}")]
    Io(#[from] io::Error),
    /// A tensor's `ne` gives no valid byte size for its type.
    #[error("tensor `{name}`: ne {ne:?} is not a whole number of {ggml_type} blocks per row")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Its `ne`.
        ne: Vec<u64>,
        /// Its type.
        ggml_type: GgmlType,
    },
    /// The callback wrote a different number of bytes than the tensor holds.
    #[error("tensor `{name}`: the callback wrote {wrote} bytes, the tensor holds {expected}")]
    WrongLength {
        /// Tensor name.
        name: String,
        /// Bytes the tensor holds.
        expected: u64,
        /// Bytes written.
        wrote: u64,
    },
    /// `write_streamed` was called on a writer that already holds in-memory tensors.
    #[error("write_streamed takes its tensors as an argument; this writer already holds {0}")]
    MixedTensors(usize),
}

/// Counts the bytes that pass through to the inner writer.
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl GgufWriter {
    /// Streams a file with this writer's header fields and key/value pairs and the `tensors`
    /// given, laid out back to back at `alignment`-aligned offsets. `fill(i, sink)` is called
    /// once per tensor, in order, and must write exactly `tensors[i].n_bytes()` bytes to `sink`;
    /// padding is written between tensors. Only the header and one tensor's worth of whatever
    /// `fill` buffers are in memory at a time. Returns the bytes written.
    ///
    /// Errors: [`GgufWriteError::MixedTensors`] when [`GgufWriter::tensor`] was used;
    /// [`GgufWriteError::BadShape`]; [`GgufWriteError::WrongLength`] (the file is then
    /// incomplete); [`GgufWriteError::Io`] from the sink or the callback.
    pub fn write_streamed<W: Write>(
        &self,
        out: &mut W,
        tensors: &[StreamedTensor],
        mut fill: impl FnMut(usize, &mut dyn Write) -> io::Result<()>,
    ) -> Result<u64, GgufWriteError> {
        if !self.tensors.is_empty() {
            return Err(GgufWriteError::MixedTensors(self.tensors.len()));
        }
        let sizes = tensors
            .iter()
            .map(|t| {
                t.n_bytes().ok_or_else(|| GgufWriteError::BadShape {
                    name: t.name.clone(),
                    ne: t.ne.clone(),
                    ggml_type: t.ggml_type,
                })
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let align = self.alignment as u64;
        let mut header = Vec::new();
        header.extend_from_slice(&self.magic);
        header.extend_from_slice(&self.version.to_le_bytes());
        header.extend_from_slice(
            &self
                .tensor_count
                .unwrap_or(tensors.len() as u64)
                .to_le_bytes(),
        );
        header.extend_from_slice(&self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for kv in &self.kvs {
            header.extend_from_slice(kv);
        }
        let mut offset = 0u64;
        for (t, &size) in tensors.iter().zip(&sizes) {
            header.extend_from_slice(&gguf_string(t.name.as_bytes()));
            header.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + size).next_multiple_of(align);
        }
        header.resize(header.len().next_multiple_of(self.alignment), 0);
        out.write_all(&header)?;
        let mut total = header.len() as u64;
        for (i, (t, &size)) in tensors.iter().zip(&sizes).enumerate() {
            let mut sink = Counting { inner: out, n: 0 };
            fill(i, &mut sink)?;
            if sink.n != size {
                return Err(GgufWriteError::WrongLength {
                    name: t.name.clone(),
                    expected: size,
                    wrote: sink.n,
                });
            }
            let pad = size.next_multiple_of(align) - size;
            out.write_all(&vec![0u8; pad as usize])?;
            total += size + pad;
        }
        out.flush()?;
        Ok(total)
    }
}

/// Every tensor of `file` as a [`TensorSpec`] at its original offset, data copied.
pub fn tensor_specs(file: &GgufFile) -> Vec<TensorSpec> {
    file.tensors()
        .iter()
        .map(|t| TensorSpec {
            name: t.name.as_bytes().to_vec(),
            ne: t.ne.iter().map(|&d| d as u64).collect(),
            type_id: t.ggml_type.id(),
            offset: Some((t.offset - file.data_start()) as u64),
            data: file.tensor_data(t).to_vec(),
        })
        .collect()
}

/// A gguf string: `u64` length + the bytes.
pub fn gguf_string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

/// The type id and the bytes that follow it for `value`.
pub fn encode_value(value: &MetaValue) -> (u32, Vec<u8>) {
    use value_type as vt;
    match value {
        MetaValue::U8(v) => (vt::U8, v.to_le_bytes().to_vec()),
        MetaValue::I8(v) => (vt::I8, v.to_le_bytes().to_vec()),
        MetaValue::U16(v) => (vt::U16, v.to_le_bytes().to_vec()),
        MetaValue::I16(v) => (vt::I16, v.to_le_bytes().to_vec()),
        MetaValue::U32(v) => (vt::U32, v.to_le_bytes().to_vec()),
        MetaValue::I32(v) => (vt::I32, v.to_le_bytes().to_vec()),
        MetaValue::F32(v) => (vt::F32, v.to_le_bytes().to_vec()),
        MetaValue::Bool(v) => (vt::BOOL, vec![u8::from(*v)]),
        MetaValue::String(s) => (vt::STRING, gguf_string(s.as_bytes())),
        MetaValue::Array(a) => (vt::ARRAY, encode_array(a)),
        MetaValue::U64(v) => (vt::U64, v.to_le_bytes().to_vec()),
        MetaValue::I64(v) => (vt::I64, v.to_le_bytes().to_vec()),
        MetaValue::F64(v) => (vt::F64, v.to_le_bytes().to_vec()),
    }
}

/// An array payload: element type id, `u64` count, the elements.
pub fn encode_array(array: &MetaArray) -> Vec<u8> {
    use value_type as vt;
    fn fixed<T, const N: usize>(id: u32, v: &[T], enc: fn(&T) -> [u8; N]) -> Vec<u8> {
        let mut out = id.to_le_bytes().to_vec();
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            out.extend_from_slice(&enc(x));
        }
        out
    }
    match array {
        MetaArray::U8(v) => fixed(vt::U8, v, |x| x.to_le_bytes()),
        MetaArray::I8(v) => fixed(vt::I8, v, |x| x.to_le_bytes()),
        MetaArray::U16(v) => fixed(vt::U16, v, |x| x.to_le_bytes()),
        MetaArray::I16(v) => fixed(vt::I16, v, |x| x.to_le_bytes()),
        MetaArray::U32(v) => fixed(vt::U32, v, |x| x.to_le_bytes()),
        MetaArray::I32(v) => fixed(vt::I32, v, |x| x.to_le_bytes()),
        MetaArray::F32(v) => fixed(vt::F32, v, |x| x.to_le_bytes()),
        MetaArray::Bool(v) => fixed(vt::BOOL, v, |x| [u8::from(*x)]),
        MetaArray::U64(v) => fixed(vt::U64, v, |x| x.to_le_bytes()),
        MetaArray::I64(v) => fixed(vt::I64, v, |x| x.to_le_bytes()),
        MetaArray::F64(v) => fixed(vt::F64, v, |x| x.to_le_bytes()),
        MetaArray::String(v) => {
            let mut out = vt::STRING.to_le_bytes().to_vec();
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for s in v {
                out.extend_from_slice(&gguf_string(s.as_bytes()));
            }
            out
        }
        MetaArray::Nested(v) => {
            let mut out = vt::ARRAY.to_le_bytes().to_vec();
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for a in v {
                out.extend_from_slice(&encode_array(a));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", &MetaValue::String("test".into()))
            .kv("general.alignment", &MetaValue::U32(32));
        w
    }

    /// A streamed file and the same file built in memory are byte-identical, and the reader
    /// finds every tensor's bytes where the writer put them.
    #[test]
    fn streamed_equals_in_memory() {
        let shapes: [(&str, &[u64], GgmlType); 3] = [
            ("a", &[256, 3], GgmlType::Q2_K),
            ("b", &[7], GgmlType::F32),
            ("c", &[32, 2, 2], GgmlType::Q4_0),
        ];
        let tensors: Vec<StreamedTensor> = shapes
            .iter()
            .map(|&(name, ne, ggml_type)| StreamedTensor {
                name: name.into(),
                ne: ne.to_vec(),
                ggml_type,
            })
            .collect();
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (0..t.n_bytes().unwrap())
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8))
                    .collect()
            })
            .collect();
        let mut mem = meta();
        for (t, d) in tensors.iter().zip(&data) {
            mem.tensor(&t.name, &t.ne, t.ggml_type.id(), d);
        }
        let mut streamed = Vec::new();
        let n = meta()
            .write_streamed(&mut streamed, &tensors, |i, sink| sink.write_all(&data[i]))
            .unwrap();
        assert_eq!(n, streamed.len() as u64);
        assert_eq!(streamed, mem.finish());
        let file = GgufFile::from_bytes(streamed).unwrap();
        for (t, d) in tensors.iter().zip(&data) {
            let info = file.tensor(&t.name).unwrap();
            assert_eq!(info.ggml_type, t.ggml_type);
            assert_eq!(file.tensor_data(info), &d[..]);
        }
    }

    #[test]
    fn streamed_refuses_wrong_lengths_and_shapes() {
        let t = StreamedTensor {
            name: "a".into(),
            ne: vec![256, 2],
            ggml_type: GgmlType::Q2_K,
        };
        let err = meta()
            .write_streamed(&mut Vec::new(), std::slice::from_ref(&t), |_, sink| {
                sink.write_all(&[0; 84])
            })
            .unwrap_err();
        assert!(
            matches!(
                err,
                GgufWriteError::WrongLength {
                    expected: 168,
                    wrote: 84,
                    ..
                }
            ),
            "{err}"
        );
        let bad = StreamedTensor {
            ne: vec![100, 2],
            ..t
        };
        let err = meta()
            .write_streamed(&mut Vec::new(), &[bad], |_, _| Ok(()))
            .unwrap_err();
        assert!(matches!(err, GgufWriteError::BadShape { .. }), "{err}");
    }
}
