//! Receipts: one JSON object per measurement, written by `--receipt FILE` of `aubier bench`,
//! `aubier replay` and `aubier quality`, and read by `scripts/results.py`, which builds
//! docs/RESULTS.md from the receipts under docs/bench/.
//!
//! Format (`"schema": "aubier-receipt/1"`), every field present, `null` where unknown:
//! - `kind`: `bench`, `replay`, `quality` (and `soak` for the server soak, written by hand);
//! - `date`: UTC time the measurement ended, `YYYY-MM-DDTHH:MM:SSZ`;
//! - `command`: the command line, its words quoted for a POSIX shell where needed;
//! - `commit`: the git commit the binary was built from (`build.rs`; `null` outside a checkout);
//! - `host`: [`Host`], the CPU as `/proc/cpuinfo` (`lscpu`) names it and the `cpu` backend's
//!   ISA tier;
//! - `backend`, `device`, `model`: what ran (the backend's name, the device of a GPU backend, the
//!   model file or trace);
//! - `peer`: the other engine's figures of the same measurement (`aubier bench --peer`: the JSON
//!   object of `docs/llamacpp_bench.py`), or `null`;
//! - `figures`: the command's own `--json` output, unchanged;
//! - `source`: where a receipt transcribed from the notebook took its figures (`null` for one
//!   written by a command).

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The `schema` field of every receipt.
pub const SCHEMA: &str = "aubier-receipt/1";

/// The CPU flags of the ISA tiers (`/proc/cpuinfo` names), listed in a receipt when present.
const ISA_FLAGS: [&str; 14] = [
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_vbmi",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
];

/// The machine a measurement ran on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Host {
    /// `vendor_id` of `/proc/cpuinfo` (`GenuineIntel`, `AuthenticAMD`).
    pub vendor: Option<String>,
    /// `model name` of `/proc/cpuinfo` (lscpu's "Model name").
    pub model_name: Option<String>,
    /// `cpu family`.
    pub cpu_family: Option<u32>,
    /// `model` (the model number within the family).
    pub cpu_model: Option<u32>,
    /// Logical CPUs this process may run on.
    pub cpus: Option<usize>,
    /// The ISA tier of the `cpu` backend's kernels here (`amx`, `avx512-vnni`, `avx2`,
    /// `scalar`), after any `--cpu-isa` / `$AUBIER_CPU_ISA` cap.
    pub isa: Option<String>,
    /// Which of the ISA flags the kernels use the CPU has, in a fixed order.
    pub flags: Vec<String>,
}

impl Host {
    /// This machine: `/proc/cpuinfo` (all fields `None` where it cannot be read, as off Linux),
    /// the CPU count and the `cpu` backend's ISA tier.
    pub fn this() -> Host {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut host = Host::from_cpuinfo(&text);
        host.cpus = std::thread::available_parallelism().ok().map(|n| n.get());
        host.isa = Some(aubier_runtime::backend::cpu::isa().to_owned());
        host
    }

    /// The fields of the first processor of a `/proc/cpuinfo` text (`cpus` and `isa` `None`).
    pub fn from_cpuinfo(text: &str) -> Host {
        let field = |name: &str| {
            text.lines()
                .take_while(|l| !l.trim().is_empty())
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == name).then(|| v.trim().to_owned())
                })
        };
        let present: Vec<String> = field("flags")
            .map(|f| f.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        Host {
            vendor: field("vendor_id"),
            model_name: field("model name"),
            cpu_family: field("cpu family").and_then(|v| v.parse().ok()),
            cpu_model: field("model").and_then(|v| v.parse().ok()),
            cpus: None,
            isa: None,
            flags: ISA_FLAGS
                .iter()
                .filter(|f| present.iter().any(|p| p == *f))
                .map(|f| (*f).to_owned())
                .collect(),
        }
    }
}

/// What one command measured, apart from the fields every receipt takes from the process.
#[derive(Debug)]
pub struct Measured {
    /// `bench`, `replay` or `quality`.
    pub kind: &'static str,
    /// The backend's name (`cpu (q8x2)`), if one ran.
    pub backend: Option<String>,
    /// The device of a GPU backend.
    pub device: Option<String>,
    /// The model file, or the trace a replay read.
    pub model: Option<String>,
    /// The peer engine's figures.
    pub peer: Option<Value>,
    /// The command's `--json` output.
    pub figures: Value,
}

#[derive(Serialize)]
struct Receipt<'a> {
    schema: &'static str,
    kind: &'static str,
    date: String,
    command: String,
    commit: Option<&'static str>,
    host: Host,
    backend: &'a Option<String>,
    device: &'a Option<String>,
    model: &'a Option<String>,
    peer: &'a Option<Value>,
    figures: &'a Value,
    source: Option<String>,
}

/// A receipt file, created before the measurement so that a path that cannot be written fails
/// at once rather than after a long run.
#[derive(Debug)]
pub struct ReceiptFile {
    path: PathBuf,
    file: File,
}

impl ReceiptFile {
    /// Creates (or truncates) `path`.
    ///
    /// Errors: the file cannot be created (a missing directory, no permission), naming it.
    pub fn create(path: &Path) -> anyhow::Result<ReceiptFile> {
        let file = File::create(path)
            .with_context(|| format!("--receipt: creating {}", path.display()))?;
        Ok(ReceiptFile {
            path: path.to_owned(),
            file,
        })
    }

    /// Writes the receipt of `m` (module note): this process's command line, the build's
    /// commit, this host and the current UTC time, pretty-printed JSON and a newline.
    ///
    /// Errors: the write fails (a full disk), naming the file.
    pub fn write(mut self, m: &Measured) -> anyhow::Result<()> {
        let receipt = Receipt {
            schema: SCHEMA,
            kind: m.kind,
            date: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            command: shell_words(std::env::args()),
            commit: Some(env!("AUBIER_COMMIT")).filter(|c| !c.is_empty()),
            host: Host::this(),
            backend: &m.backend,
            device: &m.device,
            model: &m.model,
            peer: &m.peer,
            figures: &m.figures,
            source: None,
        };
        let mut text = serde_json::to_string_pretty(&receipt)?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .with_context(|| format!("--receipt: writing {}", self.path.display()))
    }
}

/// Reads the peer figures of `aubier bench --peer FILE`: a JSON object with numeric
/// `prefill_tok_s.median` and `decode_tok_s.median` (the output of `docs/llamacpp_bench.py`).
///
/// Errors: the file cannot be read, is not JSON, or lacks those figures (naming which).
pub fn read_peer(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--peer: reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("--peer: {} is not JSON", path.display()))?;
    for key in ["prefill_tok_s", "decode_tok_s"] {
        if !v[key]["median"].is_number() {
            anyhow::bail!(
                "--peer: {} has no number {key}.median (expected the JSON object of \
                 docs/llamacpp_bench.py)",
                path.display()
            );
        }
    }
    Ok(v)
}

/// The command line as one string: the program's file name, then each argument, quoted in single
/// quotes when it holds anything but letters, digits and `_-./,:=+@%`.
fn shell_words(args: impl Iterator<Item = String>) -> String {
    args.enumerate()
        .map(|(i, a)| {
            let a = if i == 0 {
                Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or(a)
            } else {
                a
            };
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./,:=+@%".contains(c));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_fields_of_the_first_processor() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\
                    model name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu avx2 fma \
                    avx512f amx_int8 avx512_vnni sse\n\nprocessor\t: 1\nmodel name\t: other\n";
        let h = Host::from_cpuinfo(text);
        assert_eq!(h.vendor.as_deref(), Some("GenuineIntel"));
        assert_eq!(
            h.model_name.as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8480C")
        );
        assert_eq!((h.cpu_family, h.cpu_model), (Some(6), Some(143)));
        assert_eq!(
            h.flags,
            ["avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"]
        );
        let none = Host::from_cpuinfo("");
        assert_eq!((none.model_name, none.cpu_family), (None, None));
        assert!(none.flags.is_empty());
    }

    #[test]
    fn command_words_are_quoted_for_a_shell() {
        let words = |v: &[&str]| shell_words(v.iter().map(|s| s.to_string()));
        assert_eq!(
            words(&["/x/target/release/aubier", "bench", "--n-gen", "8"]),
            "aubier bench --n-gen 8"
        );
        assert_eq!(
            words(&["aubier", "quality", "--b", "--override-kv k=int:2", ""]),
            "aubier quality --b '--override-kv k=int:2' ''"
        );
        assert_eq!(words(&["aubier", "it's"]), r"aubier 'it'\''s'");
    }
}
