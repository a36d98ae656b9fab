//! The Vulkan devices of this machine: what each offers a compute kernel
//! ([`list_devices`]), and which one to run on ([`select`]).

use super::error::{vk_call, VulkanError};
use ash::vk;
use serde::Serialize;

/// The Vulkan instance: the loaded loader (`libvulkan.so.1`) and one `VkInstance` asking for
/// Vulkan 1.3, destroyed on drop (before the loader is unloaded).
pub(crate) struct Instance {
    /// The instance's functions and handle.
    pub(crate) instance: ash::Instance,
    /// The loader; dropped (unloaded) after `Drop::drop` destroyed the instance.
    _entry: ash::Entry,
}

impl Instance {
    /// Loads the loader and creates the instance.
    ///
    /// Errors: [`VulkanError::NoLoader`] without `libvulkan.so.1` or with a Vulkan 1.0 one;
    /// [`VulkanError::NoDevice`]
    /// when the loader finds no driver (`VK_ERROR_INCOMPATIBLE_DRIVER`); [`VulkanError::Vk`].
    pub(crate) fn new() -> Result<Self, VulkanError> {
        // SAFETY: loading the system's Vulkan loader runs its library initialisers, which is how
        // it is meant to be used; nothing else of this process is touched.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VulkanError::NoLoader {
            detail: e.to_string(),
        })?;
        // SAFETY: the loader is loaded; the call has no arguments to keep alive.
        let version = vk_call("vkEnumerateInstanceVersion", unsafe {
            entry.try_enumerate_instance_version()
        })?
        .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_1 {
            return Err(VulkanError::NoLoader {
                detail: "the Vulkan loader is version 1.0, 1.1 or later is needed".into(),
            });
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"aubier")
            .engine_name(c"aubier")
            .api_version(vk::API_VERSION_1_3);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `info` and the application info it points to outlive the call.
        match unsafe { entry.create_instance(&info, None) } {
            Ok(instance) => Ok(Self {
                instance,
                _entry: entry,
            }),
            Err(vk::Result::ERROR_INCOMPATIBLE_DRIVER) => Err(VulkanError::NoDevice {
                detail: "the loader found no driver (vkCreateInstance: \
                         VK_ERROR_INCOMPATIBLE_DRIVER)"
                    .into(),
            }),
            Err(result) => Err(VulkanError::Vk {
                call: "vkCreateInstance",
                result,
            }),
        }
    }

    /// Every physical device with its description, in the loader's order (the index of
    /// `--device N`).
    ///
    /// Errors: [`VulkanError::NoDevice`] when there is none; [`VulkanError::Vk`].
    pub(crate) fn devices(&self) -> Result<Vec<(vk::PhysicalDevice, DeviceInfo)>, VulkanError> {
        // SAFETY: the instance is alive (`self`).
        let handles = vk_call("vkEnumeratePhysicalDevices", unsafe {
            self.instance.enumerate_physical_devices()
        })?;
        if handles.is_empty() {
            return Err(VulkanError::NoDevice {
                detail: "the loader's drivers report no physical device".into(),
            });
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(index, pd)| Ok((pd, describe(&self.instance, index, pd)?)))
            .collect()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every object made from the instance (the devices of `VulkanContext`) is
        // destroyed before it: they hold the instance and drop first.
        unsafe { self.instance.destroy_instance(None) };
    }
}

/// What kind of device it is (`VkPhysicalDeviceType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// A GPU sharing the host's memory.
    Integrated,
    /// A GPU with its own memory.
    Discrete,
    /// A GPU of a virtual machine.
    Virtual,
    /// A device running on the host's CPU (Mesa's lavapipe / llvmpipe, SwiftShader).
    Cpu,
    /// Anything else the driver reports.
    Other,
}

impl DeviceType {
    /// The word `aubier devices` prints: `integrated`, `discrete`, `virtual`, `cpu`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Integrated => "integrated",
            DeviceType::Discrete => "discrete",
            DeviceType::Virtual => "virtual",
            DeviceType::Cpu => "cpu",
            DeviceType::Other => "other",
        }
    }
}

/// Limits of a device that bound a compute kernel (`VkPhysicalDeviceLimits` and extensions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Bytes one storage-buffer descriptor may span (`maxStorageBufferRange`).
    pub max_storage_buffer_range: u32,
    /// Bytes of workgroup shared memory (`maxComputeSharedMemorySize`).
    pub max_compute_shared_memory_size: u32,
    /// Invocations in one workgroup (`maxComputeWorkGroupInvocations`).
    pub max_compute_work_group_invocations: u32,
    /// Workgroup size per dimension, x y z (`maxComputeWorkGroupSize`).
    pub max_compute_work_group_size: [u32; 3],
    /// Workgroups of one dispatch per dimension, x y z (`maxComputeWorkGroupCount`).
    pub max_compute_work_group_count: [u32; 3],
    /// Bytes of push constants (`maxPushConstantsSize`).
    pub max_push_constants_size: u32,
    /// Bytes of one memory allocation (`maxMemoryAllocationSize`, Vulkan 1.1); `None` before
    /// 1.1.
    pub max_memory_allocation_size: Option<u64>,
    /// Bytes of one buffer (`maxBufferSize`, Vulkan 1.3); `None` before 1.3.
    pub max_buffer_size: Option<u64>,
    /// Bytes a host pointer imported as device memory must be aligned to
    /// (`minImportedHostPointerAlignment`); `None` without `VK_EXT_external_memory_host`.
    pub min_imported_host_pointer_alignment: Option<u64>,
}

impl Limits {
    /// Bytes of the largest buffer bound to memory of its own that the device promises to make:
    /// the smaller of [`Limits::max_memory_allocation_size`] and [`Limits::max_buffer_size`]
    /// (`u64::MAX` where the device states neither).
    pub fn max_buffer_bytes(&self) -> u64 {
        self.max_memory_allocation_size
            .unwrap_or(u64::MAX)
            .min(self.max_buffer_size.unwrap_or(u64::MAX))
    }
}

/// The features a generated kernel may use, as the device reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    /// 16-bit float arithmetic in shaders (`shaderFloat16`, Vulkan 1.2).
    pub shader_float16: bool,
    /// 8-bit integer arithmetic in shaders (`shaderInt8`, Vulkan 1.2).
    pub shader_int8: bool,
    /// 8-bit loads and stores in storage buffers (`storageBuffer8BitAccess`, Vulkan 1.2).
    pub storage_buffer_8bit_access: bool,
    /// 16-bit loads and stores in storage buffers (`storageBuffer16BitAccess`, Vulkan 1.1).
    pub storage_buffer_16bit_access: bool,
    /// Buffers addressed by 64-bit device addresses (`bufferDeviceAddress`, Vulkan 1.2).
    pub buffer_device_address: bool,
    /// 64-bit integers in shaders (`shaderInt64`, Vulkan 1.0): the generated kernels' addresses.
    pub shader_int64: bool,
    /// f64 arithmetic in shaders (`shaderFloat64`, Vulkan 1.0): the generated kernels' `ln`,
    /// `sin`, `cos`.
    pub shader_float64: bool,
    /// Host memory imported as device memory (extension `VK_EXT_external_memory_host`).
    pub external_memory_host: bool,
}

/// One memory heap of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Heap {
    /// Bytes.
    pub size: u64,
    /// Whether it is the device's own memory (`VK_MEMORY_HEAP_DEVICE_LOCAL_BIT`).
    pub device_local: bool,
}

/// A physical device as `aubier devices` shows it. The Vulkan 1.1 properties (subgroups,
/// 16-bit storage) are read on devices of Vulkan 1.1 or later, the Vulkan 1.2 ones (driver, the
/// other features) on devices of 1.2 or later; a device older than that reports them as zero or
/// `false`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Its index in the loader's order (what `--device N` names).
    pub index: usize,
    /// Device name.
    pub name: String,
    /// What kind of device it is.
    pub device_type: DeviceType,
    /// Vulkan version of the device, `major.minor.patch`.
    pub api_version: String,
    /// Driver version in the vendor's convention (NVIDIA: 10.8.8.6 bits; others: as a Vulkan
    /// version).
    pub driver_version: String,
    /// Driver name and description (`VkPhysicalDeviceDriverProperties`), empty before 1.2.
    pub driver: String,
    /// Invocations in a subgroup (`subgroupSize`; 0 before 1.1).
    pub subgroup_size: u32,
    /// Subgroup operations supported (`basic`, `vote`, `arithmetic`, `ballot`, `shuffle`,
    /// `shuffle_relative`, `clustered`, `quad`).
    pub subgroup_operations: Vec<&'static str>,
    /// Limits of compute kernels.
    pub limits: Limits,
    /// Memory heaps.
    pub heaps: Vec<Heap>,
    /// Features.
    pub features: Features,
}

impl DeviceInfo {
    /// Bytes of its largest device-local heap (`None` without one).
    pub fn device_heap(&self) -> Option<u64> {
        self.heaps
            .iter()
            .filter(|h| h.device_local)
            .map(|h| h.size)
            .max()
    }

    /// Whether it runs on the host's CPU (lavapipe / llvmpipe): usable for tests, never chosen
    /// by [`select`] unless named or allowed.
    pub fn is_software(&self) -> bool {
        self.device_type == DeviceType::Cpu
    }
}

/// Every Vulkan device of this machine, in the loader's order.
///
/// Errors: [`VulkanError::NoLoader`] without the Vulkan loader, [`VulkanError::NoDevice`]
/// without a driver or a device (both say what to install), [`VulkanError::Vk`] when a query
/// fails.
pub fn list_devices() -> Result<Vec<DeviceInfo>, VulkanError> {
    Ok(Instance::new()?
        .devices()?
        .into_iter()
        .map(|(_, info)| info)
        .collect())
}

/// The device to run on: the one `index` names (`--device N`, software or not), else the first
/// hardware device, else — when `allow_software` — the first software one.
///
/// Errors: those of [`list_devices`]; [`VulkanError::Selection`] naming the devices found when
/// `index` is past them or only software devices exist and none may be chosen.
pub fn select(index: Option<usize>, allow_software: bool) -> Result<DeviceInfo, VulkanError> {
    choose(list_devices()?, index, allow_software)
}

/// [`select`] over a given list.
fn choose(
    devices: Vec<DeviceInfo>,
    index: Option<usize>,
    allow_software: bool,
) -> Result<DeviceInfo, VulkanError> {
    let found = devices
        .iter()
        .map(|d| format!("{}: {} ({})", d.index, d.name, d.device_type.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let chosen = match index {
        Some(i) => devices.into_iter().find(|d| d.index == i),
        None => {
            let (hardware, software): (Vec<_>, Vec<_>) =
                devices.into_iter().partition(|d| !d.is_software());
            let software = software.into_iter().next().filter(|_| allow_software);
            hardware.into_iter().next().or(software)
        }
    };
    chosen.ok_or_else(|| {
        let reason = match index {
            Some(i) => format!("--device {i} names no Vulkan device"),
            None if allow_software => "no Vulkan device".into(),
            None => "no hardware Vulkan device (a software device runs only when named with \
                     --device N or allowed)"
                .into(),
        };
        VulkanError::Selection { reason, found }
    })
}

/// Describes physical device `pd`, the `index`-th of the instance.
fn describe(
    instance: &ash::Instance,
    index: usize,
    pd: vk::PhysicalDevice,
) -> Result<DeviceInfo, VulkanError> {
    // SAFETY: `pd` was enumerated from `instance`, which is alive.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    // SAFETY: as above.
    let extensions = vk_call("vkEnumerateDeviceExtensionProperties", unsafe {
        instance.enumerate_device_extension_properties(pd)
    })?;
    let external_memory_host = extensions
        .iter()
        .any(|e| e.extension_name_as_c_str() == Ok(vk::EXT_EXTERNAL_MEMORY_HOST_NAME));
    let api = props.api_version;
    let v11 = api >= vk::API_VERSION_1_1;
    let v12 = api >= vk::API_VERSION_1_2;
    let v13 = api >= vk::API_VERSION_1_3;

    let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut maintenance4 = vk::PhysicalDeviceMaintenance4Properties::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut storage8 = vk::PhysicalDevice8BitStorageFeatures::default();
    let mut float16_int8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut address = vk::PhysicalDeviceBufferDeviceAddressFeatures::default();
    if v11 {
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut subgroup)
            .push_next(&mut maintenance3);
        let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut storage16);
        if v12 {
            props2 = props2.push_next(&mut driver);
            if v13 {
                props2 = props2.push_next(&mut maintenance4);
            }
            features2 = features2
                .push_next(&mut storage8)
                .push_next(&mut float16_int8)
                .push_next(&mut address);
        }
        if external_memory_host {
            props2 = props2.push_next(&mut host);
        }
        // SAFETY: `pd` belongs to the live `instance` (Vulkan 1.1, so the `2` queries exist);
        // every chained structure is of the device's version or of an extension it has, and
        // lives through the calls.
        unsafe {
            instance.get_physical_device_properties2(pd, &mut props2);
            instance.get_physical_device_features2(pd, &mut features2);
        }
    }
    // SAFETY: `pd` belongs to the live `instance`.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    // SAFETY: as above (a Vulkan 1.0 query).
    let core = unsafe { instance.get_physical_device_features(pd) };

    let text = |s: Result<&std::ffi::CStr, _>| {
        s.map(|c: &std::ffi::CStr| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let driver_text = if v12 {
        format!(
            "{}: {}",
            text(driver.driver_name_as_c_str()),
            text(driver.driver_info_as_c_str())
        )
    } else {
        String::new()
    };
    let limits = &props.limits;
    Ok(DeviceInfo {
        index,
        name: text(props.device_name_as_c_str()),
        device_type: match props.device_type {
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::Integrated,
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::Discrete,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        },
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(api),
            vk::api_version_minor(api),
            vk::api_version_patch(api)
        ),
        driver_version: driver_version(props.vendor_id, props.driver_version),
        driver: driver_text,
        subgroup_size: subgroup.subgroup_size,
        subgroup_operations: SUBGROUP_OPERATIONS
            .iter()
            .filter(|(flag, _)| subgroup.supported_operations.contains(*flag))
            .map(|&(_, name)| name)
            .collect(),
        limits: Limits {
            max_storage_buffer_range: limits.max_storage_buffer_range,
            max_compute_shared_memory_size: limits.max_compute_shared_memory_size,
            max_compute_work_group_invocations: limits.max_compute_work_group_invocations,
            max_compute_work_group_size: limits.max_compute_work_group_size,
            max_compute_work_group_count: limits.max_compute_work_group_count,
            max_push_constants_size: limits.max_push_constants_size,
            max_memory_allocation_size: v11.then_some(maintenance3.max_memory_allocation_size),
            max_buffer_size: v13.then_some(maintenance4.max_buffer_size),
            min_imported_host_pointer_alignment: external_memory_host
                .then_some(host.min_imported_host_pointer_alignment),
        },
        heaps: memory
            .memory_heaps_as_slice()
            .iter()
            .map(|h| Heap {
                size: h.size,
                device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
            })
            .collect(),
        features: Features {
            shader_float16: float16_int8.shader_float16 == vk::TRUE,
            shader_int8: float16_int8.shader_int8 == vk::TRUE,
            storage_buffer_8bit_access: storage8.storage_buffer8_bit_access == vk::TRUE,
            storage_buffer_16bit_access: storage16.storage_buffer16_bit_access == vk::TRUE,
            buffer_device_address: address.buffer_device_address == vk::TRUE,
            shader_int64: core.shader_int64 == vk::TRUE,
            shader_float64: core.shader_float64 == vk::TRUE,
            external_memory_host,
        },
    })
}

/// The subgroup operation flags and the names [`DeviceInfo::subgroup_operations`] gives them.
const SUBGROUP_OPERATIONS: [(vk::SubgroupFeatureFlags, &str); 8] = [
    (vk::SubgroupFeatureFlags::BASIC, "basic"),
    (vk::SubgroupFeatureFlags::VOTE, "vote"),
    (vk::SubgroupFeatureFlags::ARITHMETIC, "arithmetic"),
    (vk::SubgroupFeatureFlags::BALLOT, "ballot"),
    (vk::SubgroupFeatureFlags::SHUFFLE, "shuffle"),
    (
        vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE,
        "shuffle_relative",
    ),
    (vk::SubgroupFeatureFlags::CLUSTERED, "clustered"),
    (vk::SubgroupFeatureFlags::QUAD, "quad"),
];

/// PCI vendor id of NVIDIA, whose drivers pack their version in 10.8.8.6 bits.
const VENDOR_NVIDIA: u32 = 0x10de;

/// `driverVersion` as text: NVIDIA's 10.8.8.6-bit packing, else the Vulkan version packing.
fn driver_version(vendor_id: u32, v: u32) -> String {
    if vendor_id == VENDOR_NVIDIA {
        format!(
            "{}.{}.{}.{}",
            v >> 22,
            (v >> 14) & 0xff,
            (v >> 6) & 0xff,
            v & 0x3f
        )
    } else {
        format!(
            "{}.{}.{}",
            vk::api_version_major(v),
            vk::api_version_minor(v),
            vk::api_version_patch(v)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `device_type` at `index`, for [`choose`].
    fn device(index: usize, name: &str, device_type: DeviceType) -> DeviceInfo {
        DeviceInfo {
            index,
            name: name.into(),
            device_type,
            api_version: "1.3.0".into(),
            driver_version: "1.0.0".into(),
            driver: String::new(),
            subgroup_size: 32,
            subgroup_operations: vec!["basic"],
            limits: Limits {
                max_storage_buffer_range: 1 << 27,
                max_compute_shared_memory_size: 1 << 15,
                max_compute_work_group_invocations: 1024,
                max_compute_work_group_size: [1024, 1024, 64],
                max_compute_work_group_count: [65535; 3],
                max_push_constants_size: 128,
                max_memory_allocation_size: Some(1 << 31),
                max_buffer_size: None,
                min_imported_host_pointer_alignment: None,
            },
            heaps: vec![],
            features: Features::default(),
        }
    }

    #[test]
    fn vulkan_choose_prefers_hardware_and_runs_software_only_when_named_or_allowed() {
        let both = || {
            vec![
                device(0, "llvmpipe", DeviceType::Cpu),
                device(1, "gpu", DeviceType::Discrete),
            ]
        };
        assert_eq!(choose(both(), None, false).unwrap().name, "gpu");
        assert_eq!(choose(both(), None, true).unwrap().name, "gpu");
        assert_eq!(choose(both(), Some(0), false).unwrap().name, "llvmpipe");
        let soft = || vec![device(0, "llvmpipe", DeviceType::Cpu)];
        assert_eq!(choose(soft(), None, true).unwrap().name, "llvmpipe");
        let e = choose(soft(), None, false).unwrap_err().to_string();
        assert!(e.contains("no hardware Vulkan device"), "{e}");
        assert!(e.contains("0: llvmpipe (cpu)"), "{e}");
        let e = choose(both(), Some(2), true).unwrap_err().to_string();
        assert!(e.contains("--device 2 names no Vulkan device"), "{e}");
        assert!(e.contains("0: llvmpipe (cpu), 1: gpu (discrete)"), "{e}");
    }

    #[test]
    fn vulkan_driver_versions_in_the_vendors_packing() {
        assert_eq!(
            driver_version(0x10005, vk::make_api_version(0, 0, 0, 1)),
            "0.0.1"
        );
        // NVIDIA 535.104.5.0.
        let nv = (535 << 22) | (104 << 14) | (5 << 6);
        assert_eq!(driver_version(VENDOR_NVIDIA, nv), "535.104.5.0");
    }
}
