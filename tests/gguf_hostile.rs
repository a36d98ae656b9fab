//! Hostile GGUF files: one per validation rule of `aubier_runtime::gguf`, each asserting its own
//! error variant and that the message names the key or tensor; every truncation of a small valid
//! file; and byte-identical round trips of every fixture through the test writer.

use aubier_runtime::gguf::write::{encode_array, gguf_string, value_type as vt, GgufWriter};
use aubier_runtime::gguf::{GgufError, GgufFile, MetaArray, MetaValue};
use aubier_tests::{data_dir, model_path};

const F32: u32 = 0;
const Q8_0: u32 = 8;

/// A small valid file: scalars, arrays (including nested), two tensors of different types.
fn small() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", &MetaValue::String("hostile".into()))
        .kv("test.count", &MetaValue::U32(7))
        .kv("test.flag", &MetaValue::Bool(true))
        .kv(
            "test.ids",
            &MetaValue::Array(MetaArray::I32(vec![1, -2, 3])),
        )
        .kv(
            "test.words",
            &MetaValue::Array(MetaArray::String(vec!["a".into(), "bc".into()])),
        )
        .kv(
            "test.nested",
            &MetaValue::Array(MetaArray::Nested(vec![MetaArray::U8(vec![1, 2])])),
        )
        .tensor("a.weight", &[4, 2], F32, &[0u8; 32])
        .tensor("b.weight", &[32], Q8_0, &[0u8; 34]);
    w
}

fn parse(w: &GgufWriter) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(w.finish())
}

/// Asserts the message names `what`, and returns the error for matching.
fn refused(w: &GgufWriter, what: &str) -> GgufError {
    let err = parse(w).expect_err("hostile file was accepted");
    let msg = err.to_string();
    assert!(msg.contains(what), "message {msg:?} does not name {what:?}");
    err
}

#[test]
fn small_file_is_valid() {
    let f = parse(&small()).expect("valid");
    assert_eq!(f.metadata().len(), 6);
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(
        f.get("test.ids").and_then(MetaValue::as_array),
        Some(&MetaArray::I32(vec![1, -2, 3]))
    );
    let b = f.tensor("b.weight").expect("b");
    assert_eq!(b.n_bytes, 34);
    assert_eq!(b.offset % 32, 0);
}

#[test]
fn every_truncation_is_an_error() {
    // Every cut before the end of the last tensor's data is refused; the zero padding after it is
    // optional (gguf.cpp does not require it either), so those cuts are accepted.
    let bytes = small().finish();
    let full = GgufFile::from_bytes(bytes.clone()).expect("valid");
    let last = full
        .tensors()
        .iter()
        .max_by_key(|t| t.offset)
        .expect("tensors");
    let data_end = last.offset + last.n_bytes;
    assert!(
        data_end < bytes.len(),
        "the small file must end with padding"
    );
    for len in 0..data_end {
        let cut = bytes[..len].to_vec();
        assert!(
            GgufFile::from_bytes(cut).is_err(),
            "truncated to {len} bytes was accepted"
        );
    }
    for len in data_end..=bytes.len() {
        assert!(GgufFile::from_bytes(bytes[..len].to_vec()).is_ok(), "{len}");
    }
}

#[test]
fn truncated_key_value_names_the_key() {
    // Cut inside the value of "test.count" (u32 after the key string and type id).
    let mut w = GgufWriter::new();
    w.kv("test.count", &MetaValue::U32(7));
    let bytes = w.finish();
    let err = GgufFile::from_bytes(bytes[..bytes.len() - 2].to_vec()).expect_err("truncated");
    assert!(matches!(err, GgufError::Truncated { .. }), "{err:?}");
    assert!(err.to_string().contains("test.count"), "{err}");
}

#[test]
fn bad_magic() {
    let mut w = small();
    w.magic = *b"GGML";
    assert!(matches!(refused(&w, "magic"), GgufError::BadMagic { .. }));
}

#[test]
fn version_1_is_refused() {
    let mut w = small();
    w.version = 1;
    let err = refused(&w, "version");
    assert!(
        matches!(err, GgufError::UnsupportedVersion { version: 1 }),
        "{err:?}"
    );
    w.version = 2;
    assert!(parse(&w).is_ok(), "v2 must be accepted");
}

#[test]
fn absurd_tensor_count() {
    let mut w = small();
    w.tensor_count = Some(1 << 60);
    let err = refused(&w, "tensor_count");
    assert!(
        matches!(
            err,
            GgufError::AbsurdCount {
                field: "tensor_count",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn absurd_kv_count() {
    let mut w = small();
    w.kv_count = Some(u64::MAX);
    let err = refused(&w, "kv_count");
    assert!(
        matches!(
            err,
            GgufError::AbsurdCount {
                field: "kv_count",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn string_length_past_the_end() {
    // The value of test.name claims 2^60 bytes; it must fail before allocating.
    let mut w = small();
    let mut payload = (1u64 << 60).to_le_bytes().to_vec();
    payload.extend_from_slice(b"short");
    w.kv_raw(b"test.name", vt::STRING, &payload);
    let err = refused(&w, "test.name");
    assert!(
        matches!(err, GgufError::StringTooLong { len, .. } if len == 1 << 60),
        "{err:?}"
    );
}

#[test]
fn key_length_past_the_end() {
    let mut w = GgufWriter::new();
    w.kv_count = Some(1);
    let mut bytes = w.finish();
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    let err = GgufFile::from_bytes(bytes).expect_err("hostile");
    assert!(matches!(err, GgufError::StringTooLong { .. }), "{err:?}");
    assert!(err.to_string().contains("key #0"), "{err}");
}

#[test]
fn array_count_past_the_end() {
    let mut w = small();
    let mut payload = vt::U64.to_le_bytes().to_vec();
    payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
    w.kv_raw(b"test.huge", vt::ARRAY, &payload);
    let err = refused(&w, "test.huge");
    assert!(
        matches!(err, GgufError::ArrayTooLong { count, .. } if count == 1 << 60),
        "{err:?}"
    );
}

#[test]
fn string_array_count_past_the_end() {
    let mut w = small();
    let mut payload = vt::STRING.to_le_bytes().to_vec();
    payload.extend_from_slice(&u64::MAX.to_le_bytes());
    w.kv_raw(b"tokenizer.ggml.tokens", vt::ARRAY, &payload);
    let err = refused(&w, "tokenizer.ggml.tokens");
    assert!(matches!(err, GgufError::ArrayTooLong { .. }), "{err:?}");
}

#[test]
fn arrays_nested_too_deep() {
    let mut inner = MetaArray::U8(vec![1]);
    for _ in 0..20 {
        inner = MetaArray::Nested(vec![inner]);
    }
    let mut w = small();
    w.kv_raw(b"test.deep", vt::ARRAY, &encode_array(&inner));
    let err = refused(&w, "test.deep");
    assert!(matches!(err, GgufError::ArrayTooDeep { .. }), "{err:?}");
}

#[test]
fn invalid_utf8_in_value() {
    let mut w = small();
    w.kv_raw(b"general.name", vt::STRING, &gguf_string(b"bad \xff\xfe"));
    let err = refused(&w, "general.name");
    assert!(matches!(err, GgufError::InvalidUtf8 { .. }), "{err:?}");
}

#[test]
fn invalid_utf8_in_key() {
    let mut w = small();
    w.kv_raw(b"test.\xc3", vt::U8, &[1]);
    let err = refused(&w, "key #6");
    assert!(matches!(err, GgufError::InvalidUtf8 { .. }), "{err:?}");
}

#[test]
fn invalid_utf8_in_array_element() {
    let mut w = small();
    let mut payload = vt::STRING.to_le_bytes().to_vec();
    payload.extend_from_slice(&2u64.to_le_bytes());
    payload.extend_from_slice(&gguf_string(b"ok"));
    payload.extend_from_slice(&gguf_string(b"\x80"));
    w.kv_raw(b"tokenizer.ggml.merges", vt::ARRAY, &payload);
    let err = refused(&w, "tokenizer.ggml.merges");
    assert!(matches!(err, GgufError::InvalidUtf8 { .. }), "{err:?}");
    assert!(err.to_string().contains("element 1"), "{err}");
}

#[test]
fn invalid_utf8_in_tensor_name() {
    let mut w = small();
    w.tensors[1].name = b"b\xffweight".to_vec();
    let err = refused(&w, "tensor #1 name");
    assert!(matches!(err, GgufError::InvalidUtf8 { .. }), "{err:?}");
}

#[test]
fn unknown_value_type() {
    let mut w = small();
    w.kv_raw(b"test.odd", 13, &[0u8; 8]);
    let err = refused(&w, "test.odd");
    assert!(
        matches!(err, GgufError::UnknownValueType { type_id: 13, .. }),
        "{err:?}"
    );
}

#[test]
fn unknown_array_element_type() {
    let mut w = small();
    let mut payload = 99u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&1u64.to_le_bytes());
    payload.extend_from_slice(&[0u8; 8]);
    w.kv_raw(b"test.odd_array", vt::ARRAY, &payload);
    let err = refused(&w, "test.odd_array");
    assert!(
        matches!(err, GgufError::UnknownValueType { type_id: 99, .. }),
        "{err:?}"
    );
}

#[test]
fn bool_other_than_0_or_1() {
    let mut w = small();
    w.kv_raw(b"test.maybe", vt::BOOL, &[2]);
    let err = refused(&w, "test.maybe");
    assert!(matches!(err, GgufError::BadBool { byte: 2, .. }), "{err:?}");
}

#[test]
fn duplicate_key() {
    let mut w = small();
    w.kv("test.count", &MetaValue::U32(8));
    let err = refused(&w, "test.count");
    assert!(matches!(err, GgufError::DuplicateKey { .. }), "{err:?}");
}

#[test]
fn alignment_zero_or_not_power_of_two_or_wrong_type() {
    for value in [MetaValue::U32(0), MetaValue::U32(48), MetaValue::I32(-32)] {
        let mut w = small();
        w.kv("general.alignment", &value);
        let err = refused(&w, "general.alignment");
        assert!(
            matches!(err, GgufError::BadAlignment { .. }),
            "{value:?}: {err:?}"
        );
    }
    let mut w = small();
    w.kv("general.alignment", &MetaValue::String("32".into()));
    assert!(matches!(
        refused(&w, "general.alignment"),
        GgufError::BadAlignment { .. }
    ));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = small();
    w.alignment = 64;
    w.kv("general.alignment", &MetaValue::U32(64));
    let f = parse(&w).expect("valid");
    assert_eq!(f.alignment(), 64);
    assert!(f.tensors().iter().all(|t| t.offset % 64 == 0));
}

#[test]
fn zero_dims() {
    let mut w = small();
    w.tensors[0].ne = vec![];
    let err = refused(&w, "a.weight");
    assert!(
        matches!(err, GgufError::BadDimCount { n_dims: 0, .. }),
        "{err:?}"
    );
}

#[test]
fn five_dims() {
    let mut w = small();
    w.tensors[0].ne = vec![4, 2, 1, 1, 1];
    let err = refused(&w, "a.weight");
    assert!(
        matches!(err, GgufError::BadDimCount { n_dims: 5, .. }),
        "{err:?}"
    );
}

#[test]
fn zero_dimension() {
    let mut w = small();
    w.tensors[0].ne = vec![4, 0];
    let err = refused(&w, "a.weight");
    assert!(
        matches!(
            err,
            GgufError::BadDim {
                dim: 1,
                value: 0,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn negative_looking_dimension() {
    let mut w = small();
    w.tensors[0].ne = vec![4, (-2i64) as u64];
    let err = refused(&w, "a.weight");
    assert!(matches!(err, GgufError::BadDim { dim: 1, .. }), "{err:?}");
}

#[test]
fn shape_product_overflows() {
    let mut w = small();
    w.tensors[0].ne = vec![1 << 32, 1 << 31, 4];
    let err = refused(&w, "a.weight");
    assert!(matches!(err, GgufError::ShapeOverflow { .. }), "{err:?}");
}

#[test]
fn byte_size_overflows() {
    // 2^62 F32 elements is a valid int64 element count, but 2^64 bytes overflows.
    let mut w = small();
    w.tensors[0].ne = vec![1 << 31, 1 << 31];
    let err = refused(&w, "a.weight");
    assert!(matches!(err, GgufError::ShapeOverflow { .. }), "{err:?}");
}

#[test]
fn unknown_ggml_type() {
    for type_id in [4, 5, 31, 41, 1000] {
        let mut w = small();
        w.tensors[0].type_id = type_id;
        let err = refused(&w, "a.weight");
        assert!(
            matches!(err, GgufError::UnknownGgmlType { type_id: t, .. } if t == type_id),
            "{err:?}"
        );
    }
}

#[test]
fn duplicate_tensor_name() {
    let mut w = small();
    w.tensor("a.weight", &[8], F32, &[0u8; 32]);
    let err = refused(&w, "a.weight");
    assert!(matches!(err, GgufError::DuplicateTensor { .. }), "{err:?}");
}

#[test]
fn row_not_a_multiple_of_the_block_size() {
    let mut w = small();
    w.tensors[1].ne = vec![48];
    let err = refused(&w, "b.weight");
    assert!(
        matches!(
            err,
            GgufError::RowNotBlockMultiple {
                row_len: 48,
                block_size: 32,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn misaligned_offset() {
    let mut w = small();
    w.tensors[1].offset = Some(40);
    let err = refused(&w, "b.weight");
    assert!(
        matches!(err, GgufError::MisalignedOffset { offset: 40, .. }),
        "{err:?}"
    );
}

#[test]
fn data_past_the_end_of_the_file() {
    let mut w = small();
    w.tensors[1].offset = Some(1 << 40);
    w.tensors[1].data.clear();
    let err = refused(&w, "b.weight");
    assert!(matches!(err, GgufError::DataOutOfBounds { .. }), "{err:?}");
}

#[test]
fn offset_overflowing_usize() {
    let mut w = small();
    w.tensors[1].offset = Some(u64::MAX - 31);
    w.tensors[1].data.clear();
    let err = refused(&w, "b.weight");
    assert!(matches!(err, GgufError::DataOutOfBounds { .. }), "{err:?}");
}

#[test]
fn overlapping_tensors() {
    let mut w = small();
    w.tensors[1].offset = Some(0);
    let err = refused(&w, "a.weight");
    assert!(
        matches!(err, GgufError::OverlappingTensors { .. }),
        "{err:?}"
    );
}

#[test]
fn data_size_larger_than_its_slot_in_a_real_fixture() {
    // quant_vectors.gguf, with ref.F32 (256 × 8 F32 = 8192 bytes) relabelled F64: 16384 bytes, so
    // it runs into q.F16, which follows it.
    let path = data_dir().join("quants/quant_vectors.gguf");
    let file = GgufFile::open(&path).expect("fixture");
    let mut w = GgufWriter::from_file(&file);
    let t = w
        .tensors
        .iter_mut()
        .find(|t| t.name == b"ref.F32")
        .expect("ref.F32");
    t.type_id = 28;
    t.data.clear();
    let err = refused(&w, "ref.F32");
    assert!(
        matches!(err, GgufError::OverlappingTensors { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("q.F16"), "{err}");
}

#[test]
fn truncated_real_fixture_names_the_tensor() {
    // Cut the bundled model one byte short: the last tensor's data no longer fits.
    let bytes = std::fs::read(model_path("ms4-tiny256-q2k.gguf")).expect("fixture");
    let file = GgufFile::from_bytes(bytes.clone()).expect("valid");
    let last = file
        .tensors()
        .iter()
        .max_by_key(|t| t.offset)
        .expect("tensors");
    let end = last.offset + last.n_bytes;
    let err = GgufFile::from_bytes(bytes[..end - 1].to_vec()).expect_err("truncated");
    assert!(matches!(err, GgufError::DataOutOfBounds { .. }), "{err:?}");
    assert!(err.to_string().contains(&last.name), "{err}");
}

#[test]
fn every_fixture_round_trips_byte_for_byte() {
    let paths = [
        data_dir().join("models/ms4-tiny-f32.gguf"),
        data_dir().join("models/ms4-tiny-f32-split.gguf"),
        data_dir().join("models/ms4-tiny256-iq2xxs.gguf"),
        model_path("ms4-tiny256-q2k.gguf"),
        data_dir().join("quants/quant_vectors.gguf"),
        data_dir().join("tokenizer/tekken-v15-vocab.gguf"),
    ];
    for path in paths {
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let rewritten = GgufWriter::from_file(&file).finish();
        assert!(
            rewritten == file.bytes(),
            "{}: rewritten file differs",
            path.display()
        );
        let again = GgufFile::from_bytes(rewritten).expect("reparse");
        assert_eq!(again.metadata(), file.metadata());
        assert_eq!(again.tensors(), file.tensors());
    }
}
