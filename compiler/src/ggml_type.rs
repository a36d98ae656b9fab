//! The ggml tensor types a GGUF file may hold: id, name, block size and bytes per block.
//!
//! Source: llama.cpp `ggml/include/ggml.h` (`enum ggml_type`) and gguf-py `GGML_QUANT_SIZES`
//! (`gguf/constants.py`, gguf 0.19.0); `MODEL.md` §6.

use serde::{Deserialize, Serialize};

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal; )*) => {
        /// A ggml storage type. Variant names follow ggml's spelling (`Q2_K`, `IQ2_XXS`).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum GgmlType { $( $variant, )* }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$( GgmlType::$variant, )*];

            /// The type for a ggml id, or `None` for an id this reader does not know
            /// (including the removed ids 4 and 5 and the repacked 31..33, 36..38).
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id { $( $id => Some(GgmlType::$variant), )* _ => None }
            }

            /// The ggml id stored in a GGUF tensor info.
            pub fn id(self) -> u32 {
                match self { $( GgmlType::$variant => $id, )* }
            }

            /// The name as ggml and gguf-py print it (`"Q2_K"`).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Looks a type up by its ggml name.
            pub fn from_name(name: &str) -> Option<GgmlType> {
                match name { $( $name => Some(GgmlType::$variant), )* _ => None }
            }

            /// Elements per block (1 for F32/F16/BF16/I*).
            pub fn block_size(self) -> usize {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
}

impl GgmlType {
    /// Bytes of one row of `n` elements, or `None` when `n` is not a multiple of the block size
    /// or the size overflows `usize` (ggml `ggml_row_size`).
    pub fn row_size(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q2_K.row_size(512), Some(168));
        assert_eq!(GgmlType::Q2_K.row_size(100), None);
    }
}
