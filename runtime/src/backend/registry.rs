//! The backends a process knows: for each, its name (`--backend`), what it is, the options it
//! parses (`--device`, `--cpu-numerics`, …), whether `--backend auto` takes it on this machine,
//! and its constructor. The built-in backends are registered first; any crate adds its own with
//! [`register`], so a new backend is its folder plus one registration.
//!
//! `auto` takes the first registered backend whose [`Auto::When`] probe says this machine has
//! what it wants (`vulkan`: a hardware GPU), else the [`Auto::Fallback`] (`cpu`).

use super::cpu::{CpuBackend, CpuNumerics};
use super::oracle::OracleBackend;
use super::vulkan::VulkanBackend;
use super::Backend;
use crate::isa::IsaLevel;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

/// An option a backend parses: `--{name} {value}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendOption {
    /// The flag without its dashes (`device`).
    pub name: &'static str,
    /// The value's name in help (`N`).
    pub value: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// Whether `--backend auto` takes a backend.
#[derive(Clone, Copy, Debug)]
pub enum Auto {
    /// Never (`oracle`: a reference, not a product path).
    Never,
    /// When the probe says this machine has what the backend wants.
    When(fn() -> bool),
    /// When no probe of an earlier entry did.
    Fallback,
}

/// One backend of the registry.
#[derive(Clone, Copy, Debug)]
pub struct BackendEntry {
    /// Its `--backend` name.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// The options it parses.
    pub options: &'static [BackendOption],
    /// Whether `auto` takes it.
    pub auto: Auto,
    /// Makes the backend from its options (each named in `options`).
    ///
    /// Errors: a message naming the option and value it refuses.
    pub make: fn(&BackendOptions) -> Result<Arc<dyn Backend>, String>,
}

/// Option values given to a backend, by option name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendOptions(Vec<(String, String)>);

impl BackendOptions {
    /// The value of option `name`, when given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of option `name` parsed as a `T`, when given.
    ///
    /// Errors: `--{name} {value}: {why}` when it does not parse.
    pub fn parse<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        self.get(name)
            .map(|v| v.parse().map_err(|e| format!("--{name} {v}: {e}")))
            .transpose()
    }
}

/// A backend as a caller names it: `auto` or a registered name, and option values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// `auto` or a registered name.
    pub name: String,
    /// `(option, value)` pairs.
    pub options: Vec<(String, String)>,
}

impl Default for BackendSpec {
    /// `auto` without options: the product path.
    fn default() -> Self {
        BackendSpec::named("auto")
    }
}

impl BackendSpec {
    /// The backend `name` (or `auto`) without options.
    pub fn named(name: &str) -> BackendSpec {
        BackendSpec {
            name: name.to_string(),
            options: Vec::new(),
        }
    }

    /// This spec with option `name` set to `value`.
    pub fn with(mut self, name: &str, value: impl ToString) -> BackendSpec {
        self.options.push((name.to_string(), value.to_string()));
        self
    }

    /// The registered backend this spec names (`auto` resolved on this machine), made with its
    /// options.
    ///
    /// Errors: an unknown name; an option the backend does not take (naming the backends that
    /// do); the backend's refusal of a value.
    pub fn make(&self) -> Result<Arc<dyn Backend>, RegistryError> {
        let all = entries();
        let name = if self.name == "auto" {
            auto_choice(&all).ok_or_else(|| RegistryError("no backend for `auto`".into()))?
        } else {
            self.name.as_str()
        };
        let entry = all.iter().find(|e| e.name == name).ok_or_else(|| {
            let known: Vec<&str> = all.iter().map(|e| e.name).collect();
            RegistryError(format!(
                "unknown backend `{name}` (known: auto, {})",
                known.join(", ")
            ))
        })?;
        for (option, value) in &self.options {
            if !entry.options.iter().any(|o| o.name == option) {
                let takers: Vec<&str> = all
                    .iter()
                    .filter(|e| e.options.iter().any(|o| o.name == option))
                    .map(|e| e.name)
                    .collect();
                return Err(RegistryError(match takers.as_slice() {
                    [] => format!("--{option}: no backend takes it"),
                    t => format!("--{option} {value} applies to --backend {}", t.join(" / ")),
                }));
            }
        }
        (entry.make)(&BackendOptions(self.options.clone())).map_err(RegistryError)
    }
}

/// A backend the registry cannot make (the message says why).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegistryError(pub String);

/// The registry: the built-in backends, then those registered.
fn registry() -> &'static RwLock<Vec<BackendEntry>> {
    static REGISTRY: OnceLock<RwLock<Vec<BackendEntry>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(builtin()))
}

/// Every backend, in registration order (the built-in ones first).
pub fn entries() -> Vec<BackendEntry> {
    registry()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Adds `entry` to the registry.
///
/// Errors: a backend of that name (or `auto`) is registered already.
pub fn register(entry: BackendEntry) -> Result<(), RegistryError> {
    let mut all = registry().write().unwrap_or_else(PoisonError::into_inner);
    if entry.name == "auto" || all.iter().any(|e| e.name == entry.name) {
        return Err(RegistryError(format!(
            "a backend named `{}` is registered already",
            entry.name
        )));
    }
    all.push(entry);
    Ok(())
}

/// The name `auto` takes among `all`.
fn auto_choice(all: &[BackendEntry]) -> Option<&'static str> {
    all.iter()
        .find(|e| matches!(e.auto, Auto::When(probe) if probe()))
        .or_else(|| all.iter().find(|e| matches!(e.auto, Auto::Fallback)))
        .map(|e| e.name)
}

/// The backend `auto` takes on this machine.
pub fn auto_name() -> Option<&'static str> {
    auto_choice(&entries())
}

/// The built-in backends: `vulkan` (auto on a hardware GPU), `cpu` (auto's fallback), `oracle`.
fn builtin() -> Vec<BackendEntry> {
    vec![
        BackendEntry {
            name: "vulkan",
            about: "the generated GPU kernels (PHASE / WKB / KQKV fused) on a Vulkan device \
                    (`aubier devices` lists them)",
            options: &[
                BackendOption {
                    name: "device",
                    value: "N",
                    help: "the Vulkan device, by its index in `aubier devices` (default: the \
                           first hardware GPU, else a software device)",
                },
                BackendOption {
                    name: "host-store",
                    value: "auto|import|copy|stage",
                    help: "how the vulkan backend's host store reaches the device: import (the \
                           model file's mapping imported as host memory, zero copy), copy (an \
                           anonymous host copy of the experts, imported), stage (nothing \
                           imported: each step uploads the non-resident experts it routes), \
                           auto (import, else copy, else stage)",
                },
                BackendOption {
                    name: "max-buffer-bytes",
                    value: "BYTES",
                    help: "the largest buffer the vulkan backend makes, below the device's own \
                           limit (stacked experts and the fast store are split into buffers of \
                           whole experts within it)",
                },
            ],
            auto: Auto::When(VulkanBackend::hardware_present),
            make: |o| {
                let backend = VulkanBackend::new(o.parse("device")?)
                    .with_max_buffer_bytes(o.parse("max-buffer-bytes")?)
                    .with_host_mode(o.parse("host-store")?);
                Ok(Arc::new(backend))
            },
        },
        BackendEntry {
            name: "cpu",
            about: "SIMD kernels over Q8_K activations, latent attention fused (`aubier quality` \
                    EQUIVALENT to the oracle under q8x2)",
            options: &[
                BackendOption {
                    name: "cpu-numerics",
                    value: "q8x2|q8",
                    help: "numerics of the cpu backend: q8x2 (default: each activation as two \
                           Q8_K planes, value and residual) or q8 (one plane, as llama.cpp's CPU \
                           backend: faster, measurably less exact)",
                },
                BackendOption {
                    name: "cpu-isa",
                    value: "scalar|avx2|avx512-vnni|amx",
                    help: "the widest instruction set the CPU kernels use (default: all this CPU \
                           has): scalar; avx2 (AVX2, FMA, F16C); avx512-vnni (and AVX-512 \
                           F/BW/VL/VNNI); amx (and AMX-TILE/INT8). Refused where the CPU lacks \
                           it; one per process. The same bits at every level",
                },
            ],
            auto: Auto::Fallback,
            make: |o| {
                if let Some(level) = o.parse::<IsaLevel>("cpu-isa")? {
                    crate::isa::limit(level).map_err(|e| e.to_string())?;
                }
                let numerics: Option<CpuNumerics> = o.parse("cpu-numerics")?;
                Ok(Arc::new(CpuBackend::new(numerics.unwrap_or_default())))
            },
        },
        BackendEntry {
            name: "oracle",
            about: "the cranelift lowering of the unfused plan, f32 activations: the numerics \
                    reference",
            options: &[],
            auto: Auto::Never,
            make: |_| Ok(Arc::new(OracleBackend)),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_resolve_through_the_registry() {
        assert_eq!(
            BackendSpec::named("oracle").make().unwrap().name(),
            "oracle"
        );
        let cpu = BackendSpec::named("cpu").with("cpu-numerics", "q8");
        assert_eq!(cpu.make().unwrap().name(), "cpu (q8)");
        let e = BackendSpec::named("cpu")
            .with("device", 0)
            .make()
            .unwrap_err();
        assert_eq!(e.0, "--device 0 applies to --backend vulkan");
        let e = BackendSpec::named("oracle")
            .with("cpu-numerics", "q8")
            .make()
            .unwrap_err();
        assert_eq!(e.0, "--cpu-numerics q8 applies to --backend cpu");
        let e = BackendSpec::named("cpu")
            .with("cpu-numerics", "q4")
            .make()
            .unwrap_err();
        assert!(
            e.0.starts_with("--cpu-numerics q4: unknown CPU numerics"),
            "{e}"
        );
        let e = BackendSpec::named("tpu").make().unwrap_err();
        assert_eq!(
            e.0,
            "unknown backend `tpu` (known: auto, vulkan, cpu, oracle)"
        );
        assert!(register(entries()[0]).is_err());
    }
}
