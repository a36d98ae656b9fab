//! The `vulkan` backend: the plan's generated GPU kernels (the GPU target: PHASE, WKB and KQKV
//! fused) as GLSL compute shaders on one Vulkan device.
//!
//! Binding ([`VulkanBackend`]) builds every step's launches ([`launches`]) at the subgroup
//! width of the device it will run on — probed when the backend is made; a machine without a
//! device binds for [`WARP`] and says so — and refuses a step without kernels by name. What it
//! binds is what runs: loading ([`model`]) compiles exactly those kernels, after checking that
//! the device's width is the one bound for.
//!
//! Device layer. [`device`] loads the Vulkan loader at run time (`libvulkan.so.1`, through `ash`),
//! creates a Vulkan 1.3 instance and describes every physical device: limits, subgroups, heaps,
//! the features the kernels need ([`device::list_devices`]); [`device::select`] picks one.
//! [`shader`] compiles GLSL compute shaders to SPIR-V in process (shaderc), cached on disk by the
//! FNV-1a hash of the source. [`context::VulkanContext`] opens one device with one compute queue:
//! buffers bound to their own memory, addressed by their device address (no descriptor sets: a
//! kernel receives its buffers' addresses in push constants, `GL_EXT_buffer_reference`),
//! compute pipelines made once from SPIR-V, and dispatches that are recorded, submitted and
//! waited for one at a time. [`exec`] runs a bound plan on a device.
//!
//! Contract. Every failure of the loader, the driver or the compiler is a [`VulkanError`] naming
//! the call; nothing here panics on a missing loader, a missing device or bad input. A machine
//! without the loader builds and runs everything else. Handles are freed on drop, children
//! (buffers, pipelines) before the device that made them, the device before the instance.

pub(crate) mod context;
pub(crate) mod device;
mod error;
pub(crate) mod exec;
mod host_store;
mod model;
pub(crate) mod shader;
#[cfg(test)]
mod tests;

use super::{
    Backend, BackendError, BindError, Binding, BoundStep, KernelChoice, LoadInput, Loaded,
};
use crate::progress::Progress;
use aubier_compiler::plan::Plan;
use aubier_compiler::Target;
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::launch::launches;
pub use error::{VulkanError, INSTALL_HINT};
pub(crate) use host_store::HostMode;
use model::VulkanBinding;

/// The `vulkan` backend on a device (`--device N`, else the first hardware GPU, else a software
/// device), binding for that device's subgroup width.
#[derive(Clone, Debug)]
pub(crate) struct VulkanBackend {
    /// `--device N`.
    index: Option<usize>,
    /// The device found when the backend was made: its index and name.
    device: Option<(usize, String)>,
    /// The subgroup width it binds for: the device's, else [`WARP`].
    width: u32,
    /// Why no device was found.
    missing: Option<String>,
    /// The largest buffer it makes (the device's own limit when `None`).
    max_buffer_bytes: Option<u64>,
    /// How the host store reaches the device.
    host_mode: HostMode,
}

impl VulkanBackend {
    /// The backend on device `index` (`None`: the first hardware GPU, else a software device),
    /// probing the device for its subgroup width; without one, it binds for [`WARP`] and its
    /// load fails with the reason.
    pub(crate) fn new(index: Option<usize>) -> VulkanBackend {
        let (device, width, missing) = match device::select(index, true) {
            Ok(d) if d.subgroup_size > 0 => (Some((d.index, d.name)), d.subgroup_size, None),
            Ok(d) => (
                None,
                WARP,
                Some(format!(
                    "device {} ({}) reports no subgroup size",
                    d.index, d.name
                )),
            ),
            Err(e) => (None, WARP, Some(e.to_string())),
        };
        VulkanBackend {
            index,
            device,
            width,
            missing,
            max_buffer_bytes: None,
            host_mode: HostMode::Auto,
        }
    }

    /// This backend with its host store reached as `mode` (`--host-store`; `None`: auto).
    pub(crate) fn with_host_mode(self, mode: Option<HostMode>) -> VulkanBackend {
        VulkanBackend {
            host_mode: mode.unwrap_or(HostMode::Auto),
            ..self
        }
    }

    /// This backend making no buffer over `max` bytes (`None`: the device's own limit).
    pub(crate) fn with_max_buffer_bytes(self, max: Option<u64>) -> VulkanBackend {
        VulkanBackend {
            max_buffer_bytes: max,
            ..self
        }
    }

    /// Whether this machine has a hardware Vulkan device (`--backend auto` takes `vulkan` then).
    pub(crate) fn hardware_present() -> bool {
        device::select(None, false).is_ok()
    }
}

impl Backend for VulkanBackend {
    fn name(&self) -> String {
        match &self.device {
            Some((i, name)) => format!("vulkan (device {i}: {name}, subgroup {})", self.width),
            None => format!("vulkan (no device; binds for subgroup {})", self.width),
        }
    }

    fn target(&self) -> Target {
        Target::Gpu
    }

    fn bind(&self, plan: &Plan) -> Result<Binding, BindError> {
        let mut all = Vec::with_capacity(plan.steps.len());
        let mut steps = Vec::with_capacity(plan.steps.len());
        for i in 0..plan.steps.len() {
            let ls = launches(plan, i, self.width).map_err(|e| BindError {
                backend: self.name(),
                step: i,
                op: plan.steps[i].op.name(),
                reason: e.to_string(),
            })?;
            let names: Vec<&str> = ls
                .iter()
                .map(|l| l.kernel.name.rsplit_once('_').map_or("", |(base, _)| base))
                .collect();
            steps.push(BoundStep {
                choice: KernelChoice {
                    kernel: "glsl",
                    variant: if names.is_empty() {
                        "none (in place)".into()
                    } else {
                        format!("{}; subgroup {}", names.join(" + "), self.width)
                    },
                },
                // Every row's sums run in one order whatever the run's length: the mat-mat a
                // prefill launches computes the mat-vec's bits (`gpu::steps::both_forms`).
                one_token_matches_prefill: true,
            });
            all.push(ls);
        }
        let binding = VulkanBinding {
            width: self.width,
            launches: all,
        };
        Ok(Binding::new(self.name(), steps, binding))
    }

    fn load(
        &self,
        input: &LoadInput<'_>,
        progress: &mut dyn Progress,
    ) -> Result<Loaded, BackendError> {
        let err = |e: VulkanError| BackendError::Device {
            backend: "vulkan".into(),
            message: e.to_string(),
        };
        if let Some(why) = &self.missing {
            return Err(BackendError::Device {
                backend: "vulkan".into(),
                message: why.clone(),
            });
        }
        let binding: &VulkanBinding =
            input
                .binding
                .kernels()
                .ok_or_else(|| BackendError::Binding {
                    backend: self.name(),
                    detail: format!("a binding of `{}`", input.binding.backend),
                })?;
        let info = device::select(self.index, true).map_err(err)?;
        if info.subgroup_size != binding.width {
            return Err(BackendError::Binding {
                backend: self.name(),
                detail: format!(
                    "bound for subgroup width {}, device {} ({}) has {}",
                    binding.width, info.index, info.name, info.subgroup_size
                ),
            });
        }
        let ctx = context::VulkanContext::new(info.index).map_err(err)?;
        model::load(
            ctx,
            input,
            binding,
            self.max_buffer_bytes,
            self.host_mode,
            progress,
        )
        .map_err(err)
    }
}
