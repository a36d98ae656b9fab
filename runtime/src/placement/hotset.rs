//! Seed membership of the fast store (`--resident-set hotset.json`).
//!
//! Format: `{"layers": [[e, …], …]}`, one list per MoE layer, each ranked hottest first. A policy
//! seeded for `slots` slots takes the first `min(slots, len)` ids of its layer's list, so one file
//! serves every slot count of a sweep; a list shorter than `slots` leaves the rest of the fast store
//! empty at boot. Other fields are ignored.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Per-layer seed lists, hottest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSet {
    /// `[n_layers][*]`: the ids of layer `l`, hottest first.
    pub layers: Vec<Vec<u32>>,
}

/// Errors of reading or checking a [`HotSet`].
#[derive(Debug, thiserror::Error)]
pub enum HotSetError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not JSON of the form `{"layers": [[int, …], …]}`.
    #[error("resident set: {0}")]
    Json(#[from] serde_json::Error),
    /// The number of layers differs from the trace's.
    #[error("resident set has {got} layers, the trace has {expected}")]
    LayerCount {
        /// Lists in the file.
        got: usize,
        /// MoE layers of the trace.
        expected: usize,
    },
    /// An id is not below `n_experts`.
    #[error(
        "resident set layers[{layer}][{index}] = {expert} is not below n_experts = {n_experts}"
    )]
    ExpertOutOfRange {
        /// 0-based layer.
        layer: usize,
        /// 0-based index in the list.
        index: usize,
        /// The id.
        expert: u32,
        /// Experts per layer.
        n_experts: u32,
    },
    /// A list names an expert twice.
    #[error("resident set layers[{layer}] lists expert {expert} twice")]
    Duplicate {
        /// 0-based layer.
        layer: usize,
        /// The repeated id.
        expert: u32,
    },
}

impl HotSet {
    /// Reads a hot-set file. Errors: `Open`, `Json`.
    pub fn read(path: &Path) -> Result<HotSet, HotSetError> {
        let text = std::fs::read_to_string(path).map_err(|source| HotSetError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        HotSet::from_json(&text)
    }

    /// Parses hot-set JSON text. Errors: `Json`.
    pub fn from_json(text: &str) -> Result<HotSet, HotSetError> {
        Ok(serde_json::from_str(text)?)
    }

    /// Checks the set against a trace's shape: `n_layers` lists of distinct ids below `n_experts`.
    /// Errors: `LayerCount`, `ExpertOutOfRange`, `Duplicate`.
    pub fn check(&self, n_layers: usize, n_experts: u32) -> Result<(), HotSetError> {
        if self.layers.len() != n_layers {
            return Err(HotSetError::LayerCount {
                got: self.layers.len(),
                expected: n_layers,
            });
        }
        for (layer, ids) in self.layers.iter().enumerate() {
            for (index, &expert) in ids.iter().enumerate() {
                if expert >= n_experts {
                    return Err(HotSetError::ExpertOutOfRange {
                        layer,
                        index,
                        expert,
                        n_experts,
                    });
                }
                if ids[..index].contains(&expert) {
                    return Err(HotSetError::Duplicate { layer, expert });
                }
            }
        }
        Ok(())
    }

    /// The seed of `layer` for `slots` slots: its first `min(slots, len)` ids; empty when the layer
    /// is out of range (call [`HotSet::check`] first).
    pub fn seed(&self, layer: usize, slots: usize) -> &[u32] {
        self.layers
            .get(layer)
            .map_or(&[], |ids| &ids[..ids.len().min(slots)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_truncates() {
        let h = HotSet::from_json(r#"{"layers": [[3, 1, 2], [0]], "note": "x"}"#).unwrap();
        h.check(2, 4).unwrap();
        assert_eq!(h.seed(0, 2), &[3, 1]);
        assert_eq!(h.seed(1, 2), &[0]);
        assert!(matches!(
            h.check(3, 4),
            Err(HotSetError::LayerCount {
                got: 2,
                expected: 3
            })
        ));
        assert_eq!(
            h.check(2, 3).unwrap_err().to_string(),
            "resident set layers[0][0] = 3 is not below n_experts = 3"
        );
        let d = HotSet::from_json(r#"{"layers": [[1, 1]]}"#).unwrap();
        assert!(matches!(
            d.check(1, 4),
            Err(HotSetError::Duplicate {
                layer: 0,
                expert: 1
            })
        ));
        assert!(HotSet::from_json(r#"{"layers": [[-1]]}"#).is_err());
        assert!(HotSet::from_json(r#"{"lay": []}"#).is_err());
    }
}
