//! Fuzzes `GgufFile::from_bytes`: any input must give `Ok` or `Err`, never a panic, an
//! out-of-bounds read or a huge allocation. On `Ok`, every metadata value and every tensor's data
//! is touched, so a range the reader accepted but cannot actually serve would show up here.
#![no_main]

use aubier_runtime::gguf::{GgufFile, MetaValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata() {
        assert!(file.get(key).is_some());
        let _ = (
            value.as_u64(),
            value.as_i64(),
            value.as_f32(),
            value.type_name(),
        );
        if let MetaValue::Array(a) = value {
            assert_eq!(a.iter().count(), a.len());
        }
    }
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len(), t.n_bytes);
        assert_eq!(t.n_bytes, t.row_bytes() * t.n_rows());
        assert!(t.offset % file.alignment() == 0);
        let checksum = bytes.iter().fold(0u8, |acc, b| acc ^ b);
        std::hint::black_box(checksum);
        assert!(std::ptr::eq(file.tensor(&t.name).expect("indexed"), t));
    }
});
