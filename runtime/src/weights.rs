//! [`Weights`]: a plan's weights bound to their tensors in the mapped GGUF file — zero-copy byte
//! views, read in place by every backend (or imported, uploaded or copied by it), plus the page
//! controls a backend uses to keep the file's pages out of its resident set where it holds
//! copies.
//!
//! Binding checks every plan weight against the file: present, the same ggml type and `ne`, and
//! exactly the bytes the type's rows take (ggml `ggml_row_size` × rows).

use crate::ggml_type::GgmlType;
use crate::gguf::{GgufFile, TensorInfo};
use aubier_compiler::plan::{Plan, WeightId};
use std::sync::Arc;

/// A plan weight that does not match the file.
#[derive(Debug, thiserror::Error)]
#[error("weight `{name}`: {detail}")]
pub struct WeightError {
    /// GGUF tensor name.
    pub name: String,
    /// What differs.
    pub detail: String,
}

/// The plan's weights in the mapped file, by [`WeightId`].
#[derive(Debug)]
pub struct Weights {
    file: Arc<GgufFile>,
    /// `plan.weights[w]`'s tensor in `file`.
    tensors: Vec<TensorInfo>,
}

impl Weights {
    /// Binds every weight of `plan` to its tensor in `file`.
    ///
    /// Errors: [`WeightError`] naming the first weight absent from the file, or whose ggml type,
    /// `ne` or byte length differs from the plan's.
    pub fn bind(file: Arc<GgufFile>, plan: &Plan) -> Result<Weights, WeightError> {
        let mut tensors = Vec::with_capacity(plan.weights.len());
        for w in &plan.weights {
            let bad = |detail: String| WeightError {
                name: w.name.clone(),
                detail,
            };
            let info = file
                .tensor(&w.name)
                .ok_or_else(|| bad("not in the file".into()))?;
            if info.ggml_type.name() != w.ggml_type || info.ne != w.ne {
                return Err(bad(format!(
                    "the plan reads {} {:?}, the file has {} {:?}",
                    w.ggml_type,
                    w.ne,
                    info.ggml_type.name(),
                    info.ne
                )));
            }
            let expected = GgmlType::from_name(&w.ggml_type).and_then(|ty| {
                let rows: usize = w.ne.iter().skip(1).product();
                ty.row_size(*w.ne.first()?)?.checked_mul(rows)
            });
            let got = file.tensor_data(info).len();
            if expected != Some(got) {
                return Err(bad(format!(
                    "{got} bytes in the file, the plan's type and shape take {expected:?}"
                )));
            }
            tensors.push(info.clone());
        }
        Ok(Weights { file, tensors })
    }

    /// The mapped file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Weights bound.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no weight is bound.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The byte view of weight `w` in the map (zero-copy); `None` past the plan's weights.
    pub fn view(&self, w: WeightId) -> Option<&[u8]> {
        self.tensors.get(w).map(|t| self.file.tensor_data(t))
    }

    /// Byte views of every weight, indexed by [`WeightId`] (zero-copy).
    pub fn views(&self) -> Vec<&[u8]> {
        self.tensors
            .iter()
            .map(|t| self.file.tensor_data(t))
            .collect()
    }

    /// Copies bytes `offset .. offset + out.len()` of `view` (a weight view) into `out` without
    /// making `view`'s pages resident in this process ([`GgufFile::read_at`]: `pread` through
    /// the page cache).
    ///
    /// Errors: the range not inside `view`, or the read's I/O error.
    pub fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read_at(view, offset, out)
    }

    /// Releases this process's resident pages of `view`, a slice of a weight view whose bytes
    /// were copied elsewhere ([`GgufFile::release_pages`]); returns the bytes released.
    pub fn release_pages(&self, view: &[u8]) -> usize {
        self.file.release_pages(view)
    }

    /// Starts reading `view`, a weight view, into the page cache without mapping it
    /// ([`GgufFile::prefetch_pages`]); returns the bytes advised.
    pub fn prefetch_pages(&self, view: &[u8]) -> usize {
        self.file.prefetch_pages(view)
    }

    /// Maps this process's pages of `view`, a slice of a weight view, now
    /// ([`GgufFile::populate_pages`]); returns the bytes populated.
    pub fn populate_pages(&self, view: &[u8]) -> usize {
        self.file.populate_pages(view)
    }
}
