//! The Vulkan device layer (devices, buffers by device address, pipelines, GLSL compiled to
//! SPIR-V), public for `aubier devices` and for the tests that run one generated kernel on a
//! device; the `vulkan` backend's execution (its loaded model and runs) stays private to it.

pub use super::vulkan::context::{Buffer, Location, Pipeline, VulkanContext};
pub use super::vulkan::device::{list_devices, select, DeviceInfo, Limits};
pub use super::vulkan::shader::compile_glsl;
pub use super::vulkan::{VulkanError, INSTALL_HINT};
