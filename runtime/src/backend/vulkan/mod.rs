//! The `vulkan` backend: the plan's generated GPU kernels (the GPU target: PHASE, WKB and KQKV
//! fused) as GLSL compute shaders on one Vulkan device ([`exec`]), and the device layer under it.
//!
//! Binding ([`VulkanBackend`]) takes every step that has GPU kernels whose every parameter
//! resolves ([`aubier_kernels_gen::gpu::launch`]) and refuses any other by name; the kernels
//! themselves are built at load for the device's subgroup width.
//!
//! Device layer. [`device`] loads the Vulkan loader at run time (`libvulkan.so.1`, through `ash`),
//! creates a Vulkan 1.3 instance and describes every physical device: limits, subgroups, heaps,
//! the features the kernels need ([`device::list_devices`]); [`device::select`] picks one.
//! [`shader`] compiles GLSL compute shaders to SPIR-V in process (shaderc), cached on disk by the
//! FNV-1a hash of the source. [`context::VulkanContext`] opens one device with one compute queue:
//! buffers bound to their own memory, addressed by their device address (no descriptor sets: a
//! kernel receives its buffers' addresses in push constants, `GL_EXT_buffer_reference`),
//! compute pipelines made once from SPIR-V, and dispatches that are recorded, submitted and
//! waited for one at a time.
//!
//! Contract. Every failure of the loader, the driver or the compiler is a [`VulkanError`] naming
//! the call; nothing here panics on a missing loader, a missing device or bad input. A machine
//! without the loader builds and runs everything else. Handles are freed on drop, children
//! (buffers, pipelines) before the device that made them, the device before the instance.

pub mod context;
pub mod device;
pub mod exec;
pub mod shader;
#[cfg(test)]
mod tests;

use super::{Backend, BackendKind, BindError, Binding, BoundStep, HostKernel, KernelChoice};
use ash::vk;
use aubier_compiler::plan::Plan;
use aubier_compiler::Target;
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::launch::launches;

/// Which Vulkan device a `vulkan` backend runs on (`--device N`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceChoice {
    /// The device's index in the loader's order ([`device::list_devices`]); `None`: the first
    /// hardware GPU, else a software device.
    pub index: Option<usize>,
}

impl DeviceChoice {
    /// Opens the chosen device.
    ///
    /// Errors: those of [`device::select`] (no loader, no device, no such index) and of
    /// [`context::VulkanContext::new`].
    pub fn open(self) -> Result<context::VulkanContext, VulkanError> {
        let info = device::select(self.index, true)?;
        context::VulkanContext::new(info.index)
    }
}

/// The `vulkan` backend on a [`DeviceChoice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct VulkanBackend {
    /// The device.
    pub device: DeviceChoice,
}

impl Backend for VulkanBackend {
    fn target(&self) -> Target {
        Target::Gpu
    }

    fn bind(&self, plan: &Plan) -> Result<Binding, BindError> {
        let steps = (0..plan.steps.len())
            .map(|i| {
                let ls = launches(plan, i, WARP).map_err(|e| BindError {
                    backend: "vulkan",
                    step: i,
                    op: plan.steps[i].op.name(),
                    reason: e.to_string(),
                })?;
                let names: Vec<&str> = ls
                    .iter()
                    .map(|l| l.kernel.name.rsplit_once('_').map_or("", |(base, _)| base))
                    .collect();
                Ok(BoundStep {
                    choice: KernelChoice {
                        kernel: "glsl",
                        variant: if names.is_empty() {
                            "none (in place)".into()
                        } else {
                            format!("{}; subgroup width of the device", names.join(" + "))
                        },
                    },
                    kernel: HostKernel::Device,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Binding {
            backend: BackendKind::Vulkan(self.device),
            steps,
        })
    }
}

/// How to get a Vulkan device on Debian or Ubuntu; part of the messages of
/// [`VulkanError::NoLoader`] and [`VulkanError::NoDevice`].
pub const INSTALL_HINT: &str =
    "install the Vulkan loader and a driver, e.g. `apt-get install -y libvulkan1 mesa-vulkan-drivers` \
     (mesa-vulkan-drivers has lavapipe, a Vulkan device on the CPU)";

/// Errors of the Vulkan device layer.
#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    /// The Vulkan loader (`libvulkan.so.1`) could not be loaded.
    #[error("no Vulkan loader: {detail}; {INSTALL_HINT}")]
    NoLoader {
        /// What the dynamic loader said.
        detail: String,
    },
    /// The loader found no Vulkan device (no driver, or none that sees a device).
    #[error("no Vulkan device: {detail}; {INSTALL_HINT}")]
    NoDevice {
        /// What was tried.
        detail: String,
    },
    /// [`device::select`] found no device it may choose.
    #[error("{reason}; devices found: {found}")]
    Selection {
        /// Why none was chosen.
        reason: String,
        /// The devices found, `index: name (type)`, comma-separated.
        found: String,
    },
    /// The device lacks something this layer needs.
    #[error("Vulkan device {device} (`{name}`): {what}")]
    Unsupported {
        /// Device index.
        device: usize,
        /// Device name.
        name: String,
        /// What is missing.
        what: String,
    },
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Vk {
        /// The Vulkan function.
        call: &'static str,
        /// Its result code.
        result: vk::Result,
    },
    /// shaderc could not be set up or refused a shader.
    #[error("compiling GLSL shader `{name}`:\n{log}")]
    Compile {
        /// The shader's name.
        name: String,
        /// The compiler's messages.
        log: String,
    },
    /// An argument does not fit: a byte range past a buffer, push constants of the wrong size,
    /// a grid past the device's limit, words that are not SPIR-V.
    #[error("{0}")]
    Invalid(String),
}

/// `Err(VulkanError::Vk)` naming `call` for a failed Vulkan result.
pub(crate) fn vk_call<T>(
    call: &'static str,
    r: ash::prelude::VkResult<T>,
) -> Result<T, VulkanError> {
    r.map_err(|result| VulkanError::Vk { call, result })
}

/// The magic number that starts every SPIR-V module (word 0).
const SPIRV_MAGIC: u32 = 0x0723_0203;

/// Words of the SPIR-V header (magic, version, generator, bound, schema).
const SPIRV_HEADER_WORDS: usize = 5;

/// Whether `words` can be a SPIR-V module: at least the header, starting with the magic number.
fn is_spirv(words: &[u32]) -> bool {
    words.len() >= SPIRV_HEADER_WORDS && words[0] == SPIRV_MAGIC
}
