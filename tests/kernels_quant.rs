//! The GPU dequant device functions (`aubier_kernels_gen::gpu::quant`) against gguf-py.
//!
//! * Every supported type's tables and function, concatenated into one host C++ program
//!   (`__device__`/`__constant__` defined empty) and compiled with `clang++-19`, decode every
//!   row of `q.<TYPE>` in `tests/data/quants/quant_vectors.gguf` chunk by chunk; the values
//!   must equal `ref.<TYPE>` — `gguf.quants.dequantize`'s output — **bit for bit**, every
//!   element. Where the host has FMA, the program is also built with `-mfma -ffp-contract=fast`
//!   (what HIP and CUDA do by default) and must give the same bits; it is also built with
//!   `-fsanitize=alignment,address`, so every word load is at an address its width divides and
//!   none reads outside its row (the k-quants' 64-bit words cover up to 6 bytes around a run).
//! * Each type's output on its own (tables + function) is a complete translation unit.
//! * All functions, each called by a trivial `__global__` kernel, compile for a GPU with
//!   `clang-19 -x hip --offload-arch=gfx1201 -nogpuinc -nogpulib --cuda-device-only
//!   --no-gpu-bundle-output -O3 -fuse-ld=lld` (header-free, under a minimal prelude), and the
//!   code object holds every kernel.
//!
//! Without clang-19 the tests fail and say what to install; they never pass silently.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aubier_kernels_gen::gpu::quant::{device_fn, device_tables, supported_types, Lang};
use aubier_runtime::ggml_type::GgmlType;
use aubier_runtime::gguf::GgufFile;
use aubier_tests::run_clang;

/// Elements each device function call writes.
const CHUNK: usize = 16;

/// One type's fixture rows.
struct Case {
    name: String,
    /// Raw blocks, one entry per row.
    q_rows: Vec<Vec<u8>>,
    /// gguf-py's values, one entry per row.
    ref_rows: Vec<Vec<f32>>,
}

/// The fixture rows of `name` (`q.<name>` and `ref.<name>`).
fn load_case(file: &GgufFile, name: &str) -> Case {
    let q = file
        .tensor(&format!("q.{name}"))
        .unwrap_or_else(|| panic!("tensor q.{name} missing"));
    let r = file
        .tensor(&format!("ref.{name}"))
        .unwrap_or_else(|| panic!("tensor ref.{name} missing"));
    assert_eq!(q.ggml_type.name(), name, "q.{name} type");
    assert_eq!(r.ggml_type, GgmlType::F32, "ref.{name} type");
    assert_eq!(q.ne, r.ne, "q.{name} and ref.{name} shapes");
    let q_rows: Vec<Vec<u8>> = file
        .tensor_data(q)
        .chunks(q.row_bytes())
        .map(<[u8]>::to_vec)
        .collect();
    let values: Vec<f32> = file
        .tensor_data(r)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let ref_rows: Vec<Vec<f32>> = values.chunks(r.row_len()).map(<[f32]>::to_vec).collect();
    assert_eq!(q_rows.len(), ref_rows.len(), "{name}: rows");
    assert!(!q_rows.is_empty(), "{name}: no rows");
    assert_eq!(r.row_len() % CHUNK, 0, "{name}: row length");
    Case {
        name: name.to_string(),
        q_rows,
        ref_rows,
    }
}

/// Every supported type's fixture rows; every supported type must be in the fixture.
fn cases() -> Vec<Case> {
    let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let listed: BTreeSet<String> = file
        .get("quant_vectors.types")
        .and_then(|v| v.as_strings())
        .expect("quant_vectors.types is a string array")
        .iter()
        .cloned()
        .collect();
    supported_types()
        .iter()
        .map(|&name| {
            assert!(listed.contains(name), "{name} has no quant vectors");
            load_case(&file, name)
        })
        .collect()
}

/// A scratch directory for this test binary's sources and programs.
fn work_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kernels_quant_{test}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Every supported type's tables and function, in one translation unit.
fn all_device_code() -> String {
    let mut text = String::new();
    for &name in supported_types() {
        write!(
            text,
            "{}",
            device_tables(name, Lang::Cpp).expect("supported")
        )
        .expect("write");
        write!(text, "{}", device_fn(name, Lang::Cpp).expect("supported")).expect("write");
    }
    text
}

/// The host harness: `prog TYPE CHUNKS_PER_ROW ROW_BYTES < rows > values` decodes each row of
/// stdin with `aubier_dq16_<type>` for c = 0, 1, … and writes the f32 values (native order) to
/// stdout. `out` is refilled with a NaN sentinel before each call, so an element a function
/// fails to write cannot match a (finite) reference value.
fn host_program() -> String {
    let mut text = String::from(
        "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <vector>\n\
         #define __device__\n#define __constant__\n",
    );
    text.push_str(&all_device_code());
    text.push_str(
        "typedef void (*aubier_dq16_fn)(const unsigned char*, int, float*);\n\
         struct Entry { const char* name; aubier_dq16_fn fn; };\n\
         static const Entry entries[] = {\n",
    );
    for &name in supported_types() {
        let lower = name.to_ascii_lowercase();
        writeln!(text, "  {{\"{lower}\", aubier_dq16_{lower}}},").expect("write");
    }
    text.push_str(
        r#"};
int main(int argc, char** argv) {
  if (argc != 4) return 2;
  aubier_dq16_fn fn = 0;
  for (const Entry& e : entries) if (std::strcmp(e.name, argv[1]) == 0) fn = e.fn;
  if (!fn) return 3;
  const int chunks = std::atoi(argv[2]);
  const size_t row_bytes = (size_t)std::atol(argv[3]);
  std::vector<unsigned char> row(row_bytes);
  std::vector<float> values((size_t)chunks * 16);
  for (;;) {
    const size_t got = std::fread(row.data(), 1, row_bytes, stdin);
    if (got == 0) break;
    if (got != row_bytes) return 4;
    for (int c = 0; c < chunks; ++c) {
      float out[16];
      const unsigned int sentinel = 0x7fa5a5a5u;
      for (int j = 0; j < 16; ++j) std::memcpy(&out[j], &sentinel, 4);
      fn(row.data(), c, out);
      std::memcpy(&values[(size_t)c * 16], out, sizeof out);
    }
    if (std::fwrite(values.data(), sizeof(float), values.size(), stdout) != values.size()) return 5;
  }
  return 0;
}
"#,
    );
    text
}

/// Runs `program` on every row of `case`; the differing elements, described.
fn check_case(program: &Path, case: &Case) -> Vec<String> {
    let n = case.ref_rows[0].len();
    let row_bytes = case.q_rows[0].len();
    let mut child = Command::new(program)
        .args([
            case.name.to_ascii_lowercase(),
            (n / CHUNK).to_string(),
            row_bytes.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let input: Vec<u8> = case.q_rows.concat();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("writing rows");
    let out = child.wait_with_output().expect("harness output");
    assert!(
        out.status.success(),
        "{}: harness {}",
        case.name,
        out.status
    );
    let got: Vec<f32> = out
        .stdout
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got.len(), n * case.ref_rows.len(), "{}: values", case.name);
    let mut failures = Vec::new();
    for (row, (want, got)) in case.ref_rows.iter().zip(got.chunks(n)).enumerate() {
        let diffs: Vec<usize> = (0..n)
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        if let Some(&i) = diffs.first() {
            failures.push(format!(
                "{} row {row}: {} of {n} elements differ; first at {i} (chunk {}): got {:e} \
                 ({:#010x}), want {:e} ({:#010x})",
                case.name,
                diffs.len(),
                i / CHUNK,
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            ));
        }
    }
    failures
}

/// Compiler flag sets the host program is built with: plain; with the alignment and address
/// sanitizers, so a 16-, 32- or 64-bit word load at an address its width does not divide
/// (undefined on a GPU), or a byte read outside the row, stops the program (each row is a
/// `std::vector` of its bytes, 16-byte aligned); and (where the CPU can run it) with FMA
/// contraction everywhere.
fn host_flag_sets() -> Vec<Vec<&'static str>> {
    let mut sets = vec![
        vec!["-O2"],
        vec![
            "-O1",
            "-fsanitize=alignment,address",
            "-fno-sanitize-recover=all",
        ],
    ];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        sets.push(vec!["-O3", "-mfma", "-ffp-contract=fast"]);
    }
    sets
}

#[test]
fn device_functions_match_gguf_py_bit_for_bit() {
    let cases = cases();
    let dir = work_dir("host");
    let source = dir.join("harness.cpp");
    std::fs::write(&source, host_program()).expect("writing harness");
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for (k, flags) in host_flag_sets().into_iter().enumerate() {
        let program = dir.join(format!("harness{k}"));
        let program_arg = program.to_str().expect("utf-8 path");
        let mut args = vec![
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            program_arg,
        ];
        args.extend(&flags);
        run_clang("clang++-19", &args, &source);
        for case in &cases {
            failures.extend(
                check_case(&program, case)
                    .into_iter()
                    .map(|f| format!("[{}] {f}", flags.join(" "))),
            );
            checked += case.ref_rows.iter().map(Vec::len).sum::<usize>();
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    eprintln!(
        "{} types, {checked} elements bit-exact",
        supported_types().len()
    );
}

#[test]
fn each_type_alone_is_a_complete_translation_unit() {
    let dir = work_dir("alone");
    for &name in supported_types() {
        let source = dir.join(format!("{}.cpp", name.to_ascii_lowercase()));
        let text = format!(
            "#define __device__\n#define __constant__\n{}{}",
            device_tables(name, Lang::Cpp).expect("supported"),
            device_fn(name, Lang::Cpp).expect("supported")
        );
        std::fs::write(&source, text).expect("writing source");
        run_clang(
            "clang++-19",
            &["-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"],
            &source,
        );
    }
}

#[test]
fn device_functions_compile_for_gfx1201() {
    let dir = work_dir("gfx1201");
    let mut text = String::from(
        "#define __device__ __attribute__((device))\n\
         #define __constant__ __attribute__((constant))\n\
         #define __global__ __attribute__((global))\n",
    );
    text.push_str(&all_device_code());
    let kernels: Vec<String> = supported_types()
        .iter()
        .map(|name| format!("aubier_test_dq16_{}", name.to_ascii_lowercase()))
        .collect();
    for (name, kernel) in supported_types().iter().zip(&kernels) {
        writeln!(
            text,
            "extern \"C\" __global__ void {kernel}(const unsigned char* row, float* out) {{\n  \
             const int c = (int)(__builtin_amdgcn_workgroup_id_x() * 64u + \
             __builtin_amdgcn_workitem_id_x());\n  \
             aubier_dq16_{}(row, c, out + 16 * c);\n}}",
            name.to_ascii_lowercase()
        )
        .expect("write");
    }
    let source = dir.join("dq16.hip");
    std::fs::write(&source, text).expect("writing source");
    let object = dir.join("dq16-gfx1201.co");
    // A stale object must not pass for a fresh one.
    let _ = std::fs::remove_file(&object);
    let object_arg = object.to_str().expect("utf-8 path");
    run_clang(
        "clang-19",
        &[
            "-x",
            "hip",
            "--offload-arch=gfx1201",
            "-nogpuinc",
            "-nogpulib",
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "-O3",
            "-fuse-ld=lld",
            "-Wall",
            "-Werror",
            "-o",
            object_arg,
        ],
        &source,
    );
    let code = std::fs::read(&object).expect("code object written");
    assert_eq!(&code[..4], b"\x7fELF", "code object is an ELF file");
    for kernel in &kernels {
        let symbol = format!("{kernel}.kd");
        assert!(
            code.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
            "kernel descriptor {symbol} missing from the code object"
        );
    }
}
