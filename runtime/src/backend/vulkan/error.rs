//! The Vulkan device layer's errors ([`VulkanError`]), the install hint they carry, and the checks
//! every part of the layer shares (a Vulkan call's result, a SPIR-V header).

use ash::vk;

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
    /// An allocation would take the backend's memory on a heap past its size.
    #[error(
        "out of device memory: {wanted} bytes more on memory heap {heap}, where the backend has \
         {taken} of its {size} bytes"
    )]
    OutOfMemory {
        /// The heap's index.
        heap: usize,
        /// Its size in bytes.
        size: u64,
        /// Bytes the backend's live buffers hold there.
        taken: u64,
        /// Bytes asked for.
        wanted: u64,
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
pub(crate) fn is_spirv(words: &[u32]) -> bool {
    words.len() >= SPIRV_HEADER_WORDS && words[0] == SPIRV_MAGIC
}
