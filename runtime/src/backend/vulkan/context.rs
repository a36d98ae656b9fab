//! One open Vulkan device: buffers addressed by device address, compute pipelines, dispatch.
//!
//! Every submission (a [`VulkanContext::run`] of many dispatches and copies, one dispatch, the
//! copy of an upload or a download) is recorded into the context's one command buffer,
//! submitted to its one compute queue and waited for before the call returns, behind a barrier
//! that orders it after every earlier submission and makes its writes visible to the host: once
//! a call returns, the device uses no buffer. A [`Recording`] is the same recorded once, into a
//! command buffer of its own, and submitted ([`VulkanContext::replay`]) any number of times. Threads sharing a
//! context submit one at a time; which buffers a kernel reaches (by the addresses it is given)
//! while another thread reads or writes them is the caller's to order.

use super::device::{DeviceInfo, Instance};
use super::error::{is_spirv, vk_call, VulkanError};
use ash::vk;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The logical device and the instance it was made from, shared by the context and every
/// buffer and pipeline it made, so that they are destroyed before it.
struct Shared {
    /// The logical device.
    device: ash::Device,
    /// Bytes of memory allocated by this context's buffers, live.
    allocated: AtomicU64,
    /// Per memory heap: its size and the bytes this context's live buffers allocated from it
    /// (never more than its size: [`VulkanContext::buffer`]).
    heaps: Vec<(u64, AtomicU64)>,
    /// Bytes of host memory imported by this context's buffers, live.
    imported: AtomicU64,
    /// Dropped after `Drop::drop` destroyed the device.
    instance: Instance,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the last holder is gone: every buffer, pipeline and the context's own command
        // pool and fence (each holds this `Arc`) were destroyed; waiting for idle first makes
        // sure no submission still runs.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
        }
    }
}

/// One Vulkan device opened for compute: one queue, one command buffer, one fence.
pub struct VulkanContext {
    /// The device's description (its limits bound the arguments of every call).
    info: DeviceInfo,
    /// Memory types of the device.
    memory: vk::PhysicalDeviceMemoryProperties,
    /// The compute queue.
    queue: vk::Queue,
    /// Its queue family.
    family: u32,
    /// The pool of `cmd` (null until made).
    pool: vk::CommandPool,
    /// The command buffer every submission is recorded into.
    cmd: vk::CommandBuffer,
    /// Signalled when a submission completes (null until made).
    fence: vk::Fence,
    /// Nanoseconds per timestamp tick (`timestampPeriod`); 0 when the queue has no timestamps.
    timestamp_ns: f64,
    /// Held through each submission: the command buffer, the fence and the queue are used by
    /// one submission at a time (Vulkan's external synchronization).
    submitting: Mutex<()>,
    /// Dropped after `Drop::drop` destroyed the pool and the fence.
    shared: Arc<Shared>,
}

impl VulkanContext {
    /// Opens device `device_index` (the index of [`super::device::list_devices`]) with one
    /// compute queue, enabling `bufferDeviceAddress` and, where the device has them, 8- and
    /// 16-bit storage-buffer access, `shaderFloat16`, `shaderInt8`, `shaderInt64` and
    /// `shaderFloat64` (the generated kernels' addresses and `ln`, `sin`, `cos`), and
    /// `VK_EXT_external_memory_host` ([`VulkanContext::import_host`]).
    ///
    /// Errors: those of `list_devices`; [`VulkanError::Selection`] when no device has that
    /// index; [`VulkanError::Unsupported`] without `bufferDeviceAddress` (Vulkan 1.2) or a
    /// compute queue; [`VulkanError::Vk`].
    pub fn new(device_index: usize) -> Result<Self, VulkanError> {
        let instance = Instance::new()?;
        let mut devices = instance.devices()?;
        let found = devices
            .iter()
            .map(|(_, d)| format!("{}: {}", d.index, d.name))
            .collect::<Vec<_>>()
            .join(", ");
        let Some(pos) = devices.iter().position(|(_, d)| d.index == device_index) else {
            return Err(VulkanError::Selection {
                reason: format!("--device {device_index} names no Vulkan device"),
                found,
            });
        };
        let (pd, info) = devices.swap_remove(pos);
        let unsupported = |what: &str| VulkanError::Unsupported {
            device: info.index,
            name: info.name.clone(),
            what: what.into(),
        };
        let f = info.features;
        if !f.buffer_device_address {
            return Err(unsupported(
                "no bufferDeviceAddress (Vulkan 1.2), which every kernel's buffers need",
            ));
        }
        // SAFETY: `pd` was enumerated from the live instance.
        let families = unsafe {
            instance
                .instance
                .get_physical_device_queue_family_properties(pd)
        };
        let family = families
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| unsupported("no compute queue"))? as u32;
        // SAFETY: `pd` was enumerated from the live instance.
        let props = unsafe { instance.instance.get_physical_device_properties(pd) };
        let timestamp_ns = if families[family as usize].timestamp_valid_bits > 0 {
            f64::from(props.limits.timestamp_period)
        } else {
            0.0
        };
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(f.storage_buffer_16bit_access);
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
            .buffer_device_address(true)
            .storage_buffer8_bit_access(f.storage_buffer_8bit_access)
            .shader_float16(f.shader_float16)
            .shader_int8(f.shader_int8);
        let core = vk::PhysicalDeviceFeatures::default()
            .shader_int64(f.shader_int64)
            .shader_float64(f.shader_float64);
        let extensions = [ash::ext::external_memory_host::NAME.as_ptr()];
        let extensions = if f.external_memory_host {
            &extensions[..]
        } else {
            &[]
        };
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_features(&core)
            .enabled_extension_names(extensions)
            .push_next(&mut v11)
            .push_next(&mut v12);
        // SAFETY: `pd` belongs to the live instance; the device is Vulkan 1.2 (it has
        // bufferDeviceAddress), so the Vulkan 1.1/1.2 feature structures are valid, and every
        // feature enabled is one it reported; `create` and what it points to outlive the call.
        let device = vk_call("vkCreateDevice", unsafe {
            instance.instance.create_device(pd, &create, None)
        })?;
        // SAFETY: `pd` belongs to the live instance.
        let memory = unsafe { instance.instance.get_physical_device_memory_properties(pd) };
        // SAFETY: queue 0 of `family` was asked for in `create`.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let mut ctx = VulkanContext {
            info,
            memory,
            queue,
            family,
            pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            timestamp_ns,
            submitting: Mutex::new(()),
            shared: Arc::new(Shared {
                device,
                allocated: AtomicU64::new(0),
                heaps: memory
                    .memory_heaps_as_slice()
                    .iter()
                    .map(|h| (h.size, AtomicU64::new(0)))
                    .collect(),
                imported: AtomicU64::new(0),
                instance,
            }),
        };
        // From here on, a failure drops `ctx`, which destroys what was made.
        let d = &ctx.shared.device;
        let pool_info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(family);
        // SAFETY: the device is alive; `pool_info` outlives the call.
        ctx.pool = vk_call("vkCreateCommandPool", unsafe {
            d.create_command_pool(&pool_info, None)
        })?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(ctx.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool belongs to the device; one buffer is asked for and returned.
        let cmds = vk_call("vkAllocateCommandBuffers", unsafe {
            d.allocate_command_buffers(&alloc)
        })?;
        ctx.cmd = one("vkAllocateCommandBuffers", cmds)?;
        // SAFETY: the device is alive.
        ctx.fence = vk_call("vkCreateFence", unsafe {
            d.create_fence(&vk::FenceCreateInfo::default(), None)
        })?;
        Ok(ctx)
    }

    /// The device this context opened.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// `(allocated, imported)`: bytes of memory this context's live buffers allocated (device
    /// and host-visible alike), and bytes of host memory they imported. The backend's own
    /// allocation records: what its budget is checked against.
    pub fn memory_records(&self) -> (u64, u64) {
        (
            self.shared.allocated.load(Ordering::Relaxed),
            self.shared.imported.load(Ordering::Relaxed),
        )
    }

    /// Bytes left to this context's allocations on the heap a [`Location::Device`] or
    /// [`Location::Host`] buffer is made from (0 for [`Location::Imported`] or where no memory
    /// type fits).
    pub fn heap_left(&self, location: Location) -> u64 {
        self.memory_type(!0, location).map_or(0, |t| {
            let heap = self.memory.memory_types_as_slice()[t as usize].heap_index as usize;
            let (size, taken) = &self.shared.heaps[heap];
            size.saturating_sub(taken.load(Ordering::Relaxed))
        })
    }

    /// A buffer of `size` bytes in `location`, bound to memory of its own, usable as a storage
    /// buffer, a copy source and destination, and by its device address.
    ///
    /// The context's allocations from one heap together never exceed its size (a driver that
    /// overcommits, as lavapipe does, would otherwise let them).
    ///
    /// Errors: [`VulkanError::Invalid`] for 0 bytes; [`VulkanError::Unsupported`] when no memory
    /// type fits; [`VulkanError::OutOfMemory`] when the heap has not the room left;
    /// [`VulkanError::Vk`] (e.g. `ERROR_OUT_OF_DEVICE_MEMORY`).
    pub fn buffer(&self, size: u64, location: Location) -> Result<Buffer, VulkanError> {
        if size == 0 {
            return Err(VulkanError::Invalid("a buffer of 0 bytes".into()));
        }
        if location == Location::Imported {
            return Err(VulkanError::Invalid(
                "an imported buffer is made by `import_host`, over host memory".into(),
            ));
        }
        let d = &self.shared.device;
        let mut buffer = Buffer {
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null_mut(),
            size,
            address: 0,
            location,
            memory_bytes: 0,
            heap: None,
            shared: Arc::clone(&self.shared),
        };
        // From here on, a failure drops `buffer`, which frees what was made.
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS
                    | vk::BufferUsageFlags::INDIRECT_BUFFER,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device is alive; `info` outlives the call.
        buffer.buffer = vk_call("vkCreateBuffer", unsafe { d.create_buffer(&info, None) })?;
        // SAFETY: the buffer was made by this device.
        let needs = unsafe { d.get_buffer_memory_requirements(buffer.buffer) };
        let type_index = self.memory_type(needs.memory_type_bits, location)?;
        let heap = self.memory.memory_types_as_slice()[type_index as usize].heap_index as usize;
        let (heap_size, taken) = &self.shared.heaps[heap];
        let before = taken.fetch_add(needs.size, Ordering::Relaxed);
        buffer.heap = Some((heap, needs.size));
        if before + needs.size > *heap_size {
            return Err(VulkanError::OutOfMemory {
                heap,
                size: *heap_size,
                taken: before,
                wanted: needs.size,
            });
        }
        let mut flags =
            vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(needs.size)
            .memory_type_index(type_index)
            .push_next(&mut flags);
        // SAFETY: the device has bufferDeviceAddress enabled (the DEVICE_ADDRESS flag); `alloc`
        // outlives the call.
        buffer.memory = vk_call("vkAllocateMemory", unsafe {
            d.allocate_memory(&alloc, None)
        })?;
        buffer.memory_bytes = needs.size;
        self.shared
            .allocated
            .fetch_add(needs.size, Ordering::Relaxed);
        // SAFETY: fresh memory of a type the buffer accepts and of the size it needs, offset 0.
        vk_call("vkBindBufferMemory", unsafe {
            d.bind_buffer_memory(buffer.buffer, buffer.memory, 0)
        })?;
        if location == Location::Host {
            // SAFETY: host-visible memory, not mapped yet, mapped whole.
            let ptr = vk_call("vkMapMemory", unsafe {
                d.map_memory(
                    buffer.memory,
                    0,
                    vk::WHOLE_SIZE,
                    vk::MemoryMapFlags::empty(),
                )
            })?;
            buffer.mapped = ptr.cast();
        }
        let address = vk::BufferDeviceAddressInfo::default().buffer(buffer.buffer);
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and is bound to memory allocated
        // with the DEVICE_ADDRESS flag.
        buffer.address = unsafe { d.get_buffer_device_address(&address) };
        Ok(buffer)
    }

    /// A buffer over `len` bytes of this process's memory at `host`, imported as device memory
    /// (`VK_EXT_external_memory_host`, handle type `HOST_ALLOCATION`), addressed like any other
    /// buffer: kernels read those bytes in place. The memory must stay mapped, unchanged by the
    /// context, for the buffer's life.
    ///
    /// Errors: [`VulkanError::Unsupported`] without the extension; [`VulkanError::Invalid`] when
    /// `host` or `len` is not a multiple of `minImportedHostPointerAlignment` or `len` is 0;
    /// [`VulkanError::Vk`] when the driver refuses the pointer (some refuse a file's mapping)
    /// or the allocation.
    ///
    /// # Safety
    /// `host .. host + len` is mapped readable memory of this process that outlives the buffer
    /// and that nothing unmaps while the buffer lives.
    pub unsafe fn import_host(&self, host: *const u8, len: u64) -> Result<Buffer, VulkanError> {
        let align = self
            .info
            .limits
            .min_imported_host_pointer_alignment
            .filter(|_| self.info.features.external_memory_host)
            .ok_or_else(|| VulkanError::Unsupported {
                device: self.info.index,
                name: self.info.name.clone(),
                what: "no VK_EXT_external_memory_host: host memory cannot be imported".into(),
            })?;
        if len == 0 || !(host as u64).is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(VulkanError::Invalid(format!(
                "importing {len} bytes at {host:p}: both must be multiples of {align} bytes \
                 (minImportedHostPointerAlignment)"
            )));
        }
        let d = &self.shared.device;
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let ext = ash::ext::external_memory_host::Device::new(&self.shared.instance.instance, d);
        let mut props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the device enabled the extension (the alignment is only known with it); the
        // pointer is this process's memory (the caller's contract); `props` outlives the call.
        vk_call("vkGetMemoryHostPointerPropertiesEXT", unsafe {
            (ext.fp().get_memory_host_pointer_properties_ext)(
                d.handle(),
                handle,
                host.cast(),
                &mut props,
            )
            .result()
        })?;
        let mut buffer = Buffer {
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null_mut(),
            size: len,
            address: 0,
            location: Location::Imported,
            memory_bytes: 0,
            heap: None,
            shared: Arc::clone(&self.shared),
        };
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        // SAFETY: the device is alive; `info` outlives the call.
        buffer.buffer = vk_call("vkCreateBuffer", unsafe { d.create_buffer(&info, None) })?;
        // SAFETY: the buffer was made by this device.
        let needs = unsafe { d.get_buffer_memory_requirements(buffer.buffer) };
        let types = self.memory.memory_types_as_slice();
        let allowed = needs.memory_type_bits & props.memory_type_bits;
        let type_index = (0..types.len() as u32)
            .find(|&i| allowed & (1 << i) != 0)
            .ok_or_else(|| VulkanError::Unsupported {
                device: self.info.index,
                name: self.info.name.clone(),
                what: "no memory type can import this host memory".into(),
            })?;
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(handle)
            .host_pointer(host as *mut std::ffi::c_void);
        let mut flags =
            vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(len.max(needs.size))
            .memory_type_index(type_index)
            .push_next(&mut import)
            .push_next(&mut flags);
        // SAFETY: the pointer and size are aligned as the extension requires (checked above) and
        // name memory that outlives the allocation (the caller's contract); `alloc` and its
        // chain outlive the call.
        buffer.memory = vk_call("vkAllocateMemory (import)", unsafe {
            d.allocate_memory(&alloc, None)
        })?;
        buffer.memory_bytes = len;
        self.shared.imported.fetch_add(len, Ordering::Relaxed);
        // SAFETY: fresh memory of a type the buffer accepts, at least its size, offset 0.
        vk_call("vkBindBufferMemory", unsafe {
            d.bind_buffer_memory(buffer.buffer, buffer.memory, 0)
        })?;
        let address = vk::BufferDeviceAddressInfo::default().buffer(buffer.buffer);
        // SAFETY: as in `buffer`: SHADER_DEVICE_ADDRESS usage, memory allocated with the
        // DEVICE_ADDRESS flag.
        buffer.address = unsafe { d.get_buffer_device_address(&address) };
        Ok(buffer)
    }

    /// The first memory type among `allowed` (a bit mask) with the properties `location`
    /// wants: device-local for [`Location::Device`]; host-visible and coherent for
    /// [`Location::Host`], cached if one is.
    fn memory_type(&self, allowed: u32, location: Location) -> Result<u32, VulkanError> {
        use vk::MemoryPropertyFlags as F;
        let wanted: &[F] = match location {
            Location::Imported => &[],
            Location::Device => &[F::DEVICE_LOCAL],
            Location::Host => &[
                F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
                F::HOST_VISIBLE | F::HOST_COHERENT,
            ],
        };
        let types = self.memory.memory_types_as_slice();
        wanted
            .iter()
            .find_map(|&props| {
                (0..types.len())
                    .find(|&i| allowed & (1 << i) != 0 && types[i].property_flags.contains(props))
            })
            .map(|i| i as u32)
            .ok_or_else(|| VulkanError::Unsupported {
                device: self.info.index,
                name: self.info.name.clone(),
                what: format!("no memory type for a {location:?} buffer"),
            })
    }

    /// Writes `data` into `buffer` at byte `offset`: straight into the mapping of a
    /// [`Location::Host`] buffer, through a host staging buffer and a copy for a
    /// [`Location::Device`] one.
    ///
    /// Errors: [`VulkanError::Invalid`] when the bytes do not fit in the buffer or it belongs to
    /// another context; those of [`VulkanContext::buffer`] and of the copy's submission.
    pub fn upload(&self, buffer: &Buffer, offset: u64, data: &[u8]) -> Result<(), VulkanError> {
        self.check_range(buffer, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        match buffer.location {
            Location::Host => {
                // Host copies take the submission lock too: the mapping is touched by one thread
                // at a time, and never while a submission of this context runs.
                let _one_at_a_time = self
                    .submitting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: the range is inside the mapping (checked above); no submission is in
                // flight and no other thread copies (the lock); `data` is host memory, not the
                // mapping.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        buffer.mapped.add(offset as usize),
                        data.len(),
                    )
                };
                Ok(())
            }
            Location::Device => {
                let staging = self.buffer(data.len() as u64, Location::Host)?;
                self.upload(&staging, 0, data)?;
                self.copy(&staging, 0, buffer, offset, data.len() as u64)
            }
            Location::Imported => Err(VulkanError::Invalid(
                "an imported buffer is the host's memory: the context does not write it".into(),
            )),
        }
    }

    /// Reads `out.len()` bytes of `buffer` from byte `offset` into `out` (the way back of
    /// [`VulkanContext::upload`]).
    ///
    /// Errors: as [`VulkanContext::upload`].
    pub fn download(
        &self,
        buffer: &Buffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), VulkanError> {
        self.check_range(buffer, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        match buffer.location {
            Location::Host => {
                let _one_at_a_time = self
                    .submitting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: as in `upload`, the other way.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        buffer.mapped.add(offset as usize),
                        out.as_mut_ptr(),
                        out.len(),
                    )
                };
                Ok(())
            }
            Location::Device | Location::Imported => {
                let staging = self.buffer(out.len() as u64, Location::Host)?;
                self.copy(buffer, offset, &staging, 0, out.len() as u64)?;
                self.download(&staging, 0, out)
            }
        }
    }

    /// `Err(Invalid)` unless `buffer` is this context's and `offset..offset + len` lies in it.
    fn check_range(&self, buffer: &Buffer, offset: u64, len: usize) -> Result<(), VulkanError> {
        if !Arc::ptr_eq(&buffer.shared, &self.shared) {
            return Err(VulkanError::Invalid(
                "the buffer belongs to another Vulkan context".into(),
            ));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= buffer.size => Ok(()),
            _ => Err(VulkanError::Invalid(format!(
                "bytes {offset}..{offset}+{len} are outside the buffer of {} bytes",
                buffer.size
            ))),
        }
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` and waits.
    fn copy(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), VulkanError> {
        self.run(|r| r.copy(src, src_offset, dst, dst_offset, len))
    }

    /// A compute pipeline of the SPIR-V module `spirv` (entry point `main`) taking
    /// `push_constant_bytes` bytes of push constants and no descriptor sets (its buffers come by
    /// device address, in the push constants). Made once, dispatched any number of times.
    ///
    /// Errors: [`VulkanError::Invalid`] when `spirv` is not SPIR-V or the push constants are not
    /// a multiple of 4 bytes or exceed the device's `maxPushConstantsSize`; [`VulkanError::Vk`]
    /// when the driver refuses the module or the pipeline.
    pub fn pipeline(
        &self,
        spirv: &[u32],
        push_constant_bytes: u32,
    ) -> Result<Pipeline, VulkanError> {
        if !is_spirv(spirv) {
            return Err(VulkanError::Invalid(
                "the words given for a pipeline are not a SPIR-V module".into(),
            ));
        }
        let max = self.info.limits.max_push_constants_size;
        if !push_constant_bytes.is_multiple_of(4) || push_constant_bytes > max {
            return Err(VulkanError::Invalid(format!(
                "{push_constant_bytes} bytes of push constants: a multiple of 4 up to {max} \
                 (maxPushConstantsSize) is needed"
            )));
        }
        let d = &self.shared.device;
        let mut pipeline = Pipeline {
            pipeline: vk::Pipeline::null(),
            layout: vk::PipelineLayout::null(),
            push_constant_bytes,
            shared: Arc::clone(&self.shared),
        };
        // From here on, a failure drops `pipeline`, which destroys what was made.
        let ranges = [vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: 0,
            size: push_constant_bytes,
        }];
        let ranges: &[vk::PushConstantRange] = if push_constant_bytes == 0 {
            &[]
        } else {
            &ranges
        };
        let layout_info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(ranges);
        // SAFETY: the device is alive; `layout_info` outlives the call.
        pipeline.layout = vk_call("vkCreatePipelineLayout", unsafe {
            d.create_pipeline_layout(&layout_info, None)
        })?;
        let module_info = vk::ShaderModuleCreateInfo::default().code(spirv);
        // SAFETY: `spirv` is whole words starting with the SPIR-V header (checked above); the
        // driver validates the rest.
        let module = vk_call("vkCreateShaderModule", unsafe {
            d.create_shader_module(&module_info, None)
        })?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let create = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(pipeline.layout)];
        // SAFETY: the module and the layout belong to this device; `create` outlives the call.
        let made = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &create, None) };
        // SAFETY: the module is only read while the pipeline is made, which is done.
        unsafe { d.destroy_shader_module(module, None) };
        let made = vk_call(
            "vkCreateComputePipelines",
            made.map_err(|(_, result)| result),
        )?;
        pipeline.pipeline = one("vkCreateComputePipelines", made)?;
        Ok(pipeline)
    }

    /// A pool of `count` timestamps for [`Recorder::timestamp`].
    ///
    /// Errors: [`VulkanError::Unsupported`] when the compute queue has no timestamps;
    /// [`VulkanError::Vk`].
    pub fn timestamps(&self, count: u32) -> Result<Timestamps, VulkanError> {
        if self.timestamp_ns <= 0.0 {
            return Err(VulkanError::Unsupported {
                device: self.info.index,
                name: self.info.name.clone(),
                what: "no timestamps on the compute queue".into(),
            });
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count.max(1));
        // SAFETY: the device is alive; `info` outlives the call.
        let pool = vk_call("vkCreateQueryPool", unsafe {
            self.shared.device.create_query_pool(&info, None)
        })?;
        Ok(Timestamps {
            pool,
            count: count.max(1),
            shared: Arc::clone(&self.shared),
        })
    }

    /// The first `n` timestamps of `ts` written by the last run, in seconds since the first.
    ///
    /// Errors: [`VulkanError::Invalid`] for more than the pool holds or another context's pool;
    /// [`VulkanError::Vk`] (e.g. `NOT_READY` when one was not written).
    pub fn read_timestamps(&self, ts: &Timestamps, n: u32) -> Result<Vec<f64>, VulkanError> {
        if n > ts.count || !Arc::ptr_eq(&ts.shared, &self.shared) {
            return Err(VulkanError::Invalid(format!(
                "{n} timestamps of a pool of {} (or another context's)",
                ts.count
            )));
        }
        let mut ticks = vec![0u64; n as usize];
        // SAFETY: the pool belongs to this device and holds `n` queries; the last submission
        // was waited for, so the written ones are available.
        vk_call("vkGetQueryPoolResults", unsafe {
            self.shared.device.get_query_pool_results(
                ts.pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64,
            )
        })?;
        let first = ticks.first().copied().unwrap_or(0);
        Ok(ticks
            .iter()
            .map(|&t| t.wrapping_sub(first) as f64 * self.timestamp_ns * 1e-9)
            .collect())
    }

    /// Runs `pipeline` over `groups` workgroups (x, y, z) with `push_constants` (exactly the
    /// pipeline's push-constant bytes, as the shader lays them out: std430, little-endian, a
    /// buffer reference being its 8-byte [`Buffer::address`]) and waits for it to finish.
    ///
    /// Errors: those of [`Recorder::dispatch`]; [`VulkanError::Vk`] when the submission or the
    /// wait fails (e.g. `ERROR_DEVICE_LOST`).
    pub fn dispatch(
        &self,
        pipeline: &Pipeline,
        groups: [u32; 3],
        push_constants: &[u8],
    ) -> Result<(), VulkanError> {
        self.run(|r| r.dispatch(pipeline, groups, push_constants))
    }

    /// Records what `record` asks for (dispatches and copies, each ordered after the ones
    /// before it) into one command buffer, submits it and waits once: a whole plan step costs
    /// one submission and one wait. Nothing is submitted when `record` fails.
    ///
    /// Errors: the first error of `record`; [`VulkanError::Vk`] when the submission or the wait
    /// fails.
    pub fn run(
        &self,
        record: impl FnOnce(&mut Recorder<'_>) -> Result<(), VulkanError>,
    ) -> Result<(), VulkanError> {
        self.submit(|_, cmd| record(&mut Recorder { ctx: self, cmd }))
    }

    /// Records what `record` asks for, as [`VulkanContext::run`] does, into a command buffer of
    /// its own that [`VulkanContext::replay`] submits: the buffers and pipelines it names must
    /// outlive every replay, and what the commands read from host-visible memory (inputs,
    /// indirect dispatch counts) is read at each replay.
    ///
    /// Errors: the first error of `record`; [`VulkanError::Vk`] when the pool or the command
    /// buffer cannot be made.
    pub fn record(
        &self,
        record: impl FnOnce(&mut Recorder<'_>) -> Result<(), VulkanError>,
    ) -> Result<Recording, VulkanError> {
        let d = &self.shared.device;
        let mut rec = Recording {
            pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            shared: Arc::clone(&self.shared),
        };
        // From here on, a failure drops `rec`, which destroys the pool.
        let pool_info = vk::CommandPoolCreateInfo::default().queue_family_index(self.family);
        // SAFETY: the device is alive; `pool_info` outlives the call.
        rec.pool = vk_call("vkCreateCommandPool", unsafe {
            d.create_command_pool(&pool_info, None)
        })?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(rec.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool belongs to the device and is used by this thread alone.
        let cmds = vk_call("vkAllocateCommandBuffers", unsafe {
            d.allocate_command_buffers(&alloc)
        })?;
        rec.cmd = one("vkAllocateCommandBuffers", cmds)?;
        self.record_into(rec.cmd, vk::CommandBufferUsageFlags::empty(), |_, cmd| {
            record(&mut Recorder { ctx: self, cmd })
        })?;
        Ok(rec)
    }

    /// Submits `rec` (made by this context) and waits for it.
    ///
    /// Errors: [`VulkanError::Invalid`] for a recording of another context; [`VulkanError::Vk`]
    /// when the submission or the wait fails.
    pub fn replay(&self, rec: &Recording) -> Result<(), VulkanError> {
        if !Arc::ptr_eq(&rec.shared, &self.shared) {
            return Err(VulkanError::Invalid(
                "the recording belongs to another Vulkan context".into(),
            ));
        }
        let _one_at_a_time = self
            .submitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.submit_wait(rec.cmd)
    }

    /// Records `record` into the context's command buffer ([`VulkanContext::record_into`]),
    /// submits it and waits.
    fn submit(
        &self,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<(), VulkanError>,
    ) -> Result<(), VulkanError> {
        // A panic while holding the lock left nothing half-done that the reset below does not
        // undo.
        let _one_at_a_time = self
            .submitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let cmd = self.cmd;
        // SAFETY: the command buffer is not pending (every submission is waited for, under the
        // lock held here) and its pool allows resetting it.
        vk_call("vkResetCommandBuffer", unsafe {
            self.shared
                .device
                .reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
        })?;
        self.record_into(cmd, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, record)?;
        self.submit_wait(cmd)
    }

    /// Records `record` into `cmd` (initial or reset, used by this thread alone) between two
    /// barriers: every earlier write of the queue before it; its writes visible to the host
    /// after it.
    fn record_into(
        &self,
        cmd: vk::CommandBuffer,
        usage: vk::CommandBufferUsageFlags,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<(), VulkanError>,
    ) -> Result<(), VulkanError> {
        let d = &self.shared.device;
        let before = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)];
        let after = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        let begin = vk::CommandBufferBeginInfo::default().flags(usage);
        // SAFETY: `cmd` is in the initial state and not pending (the caller's contract); the
        // barriers and `begin` outlive the calls.
        unsafe {
            vk_call("vkBeginCommandBuffer", d.begin_command_buffer(cmd, &begin))?;
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &before,
                &[],
                &[],
            );
        }
        if let Err(e) = record(d, cmd) {
            // SAFETY: `cmd` is recording; ending it leaves it executable but unsubmitted, and
            // the next submission resets it.
            unsafe {
                let _ = d.end_command_buffer(cmd);
            }
            return Err(e);
        }
        // SAFETY: `cmd` was begun above and recorded by `record`.
        unsafe {
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &after,
                &[],
                &[],
            );
            vk_call("vkEndCommandBuffer", d.end_command_buffer(cmd))
        }
    }

    /// Submits the recorded `cmd` and waits for it; the caller holds the submission lock.
    fn submit_wait(&self, cmd: vk::CommandBuffer) -> Result<(), VulkanError> {
        let d = &self.shared.device;
        let cmds = [cmd];
        let submits = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: `cmd` is executable and not pending (every submission is waited for under the
        // lock the caller holds); the fence is unsignalled (reset before the submission) and not
        // in use; the wait returns once the queue finished, so nothing of this submission is in
        // flight afterwards.
        unsafe {
            vk_call("vkResetFences", d.reset_fences(&[self.fence]))?;
            vk_call(
                "vkQueueSubmit",
                d.queue_submit(self.queue, &submits, self.fence),
            )?;
            vk_call(
                "vkWaitForFences",
                d.wait_for_fences(&[self.fence], true, u64::MAX),
            )
        }
    }
}

/// The command buffer of one [`VulkanContext::run`] being recorded. Every command is followed
/// by a barrier that orders the next one after it (shader and transfer writes before shader and
/// transfer reads and writes), so commands run as if one after the other.
pub struct Recorder<'a> {
    ctx: &'a VulkanContext,
    cmd: vk::CommandBuffer,
}

impl Recorder<'_> {
    /// Records `pipeline` over `groups` workgroups with `push_constants` (see
    /// [`VulkanContext::dispatch`]).
    ///
    /// Errors: [`VulkanError::Invalid`] when the push constants have another size than the
    /// pipeline's, a group count exceeds `maxComputeWorkGroupCount`, or the pipeline
    /// belongs to another context.
    pub fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        groups: [u32; 3],
        push_constants: &[u8],
    ) -> Result<(), VulkanError> {
        let max = self.ctx.info.limits.max_compute_work_group_count;
        if groups.iter().zip(max).any(|(&g, m)| g > m) {
            return Err(VulkanError::Invalid(format!(
                "{groups:?} workgroups exceed the device's maxComputeWorkGroupCount {max:?}"
            )));
        }
        self.bind(pipeline, push_constants)?;
        // SAFETY: a compute pipeline is bound; `cmd` is recording.
        unsafe {
            self.ctx
                .shared
                .device
                .cmd_dispatch(self.cmd, groups[0], groups[1], groups[2])
        };
        self.barrier();
        Ok(())
    }

    /// Records `pipeline` with `push_constants` over the workgroup counts the device reads, when
    /// the commands run, from the three `u32` at `offset` of `counts`
    /// (`VkDispatchIndirectCommand`; a count of 0 dispatches nothing). The counts are the
    /// caller's to keep within `maxComputeWorkGroupCount`.
    ///
    /// Errors: [`VulkanError::Invalid`] when the push constants have another size than the
    /// pipeline's, the counts lie outside `counts` or off a 4-byte boundary, or the pipeline or
    /// the buffer belongs to another context.
    pub fn dispatch_indirect(
        &mut self,
        pipeline: &Pipeline,
        counts: &Buffer,
        offset: u64,
        push_constants: &[u8],
    ) -> Result<(), VulkanError> {
        self.bind(pipeline, push_constants)?;
        self.ctx.check_range(counts, offset, INDIRECT_BYTES)?;
        if !offset.is_multiple_of(4) {
            return Err(VulkanError::Invalid(format!(
                "indirect dispatch counts at offset {offset}, not a multiple of 4"
            )));
        }
        // SAFETY: the buffer belongs to this device (checked above), has INDIRECT_BUFFER usage
        // and holds the 12 bytes at the 4-aligned `offset`; a compute pipeline is bound; `cmd`
        // is recording.
        unsafe {
            self.ctx
                .shared
                .device
                .cmd_dispatch_indirect(self.cmd, counts.buffer, offset)
        };
        self.barrier();
        Ok(())
    }

    /// Binds `pipeline` and records its push constants.
    ///
    /// Errors: [`VulkanError::Invalid`] when the push constants have another size than the
    /// pipeline's or the pipeline belongs to another context.
    fn bind(&mut self, pipeline: &Pipeline, push_constants: &[u8]) -> Result<(), VulkanError> {
        if !Arc::ptr_eq(&pipeline.shared, &self.ctx.shared) {
            return Err(VulkanError::Invalid(
                "the pipeline belongs to another Vulkan context".into(),
            ));
        }
        if push_constants.len() != pipeline.push_constant_bytes as usize {
            return Err(VulkanError::Invalid(format!(
                "{} bytes of push constants for a pipeline taking {}",
                push_constants.len(),
                pipeline.push_constant_bytes
            )));
        }
        let d = &self.ctx.shared.device;
        // SAFETY: the pipeline and its layout belong to this device (checked above); the push
        // constants are exactly its range; `cmd` is recording.
        unsafe {
            d.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            if !push_constants.is_empty() {
                d.cmd_push_constants(
                    self.cmd,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    push_constants,
                );
            }
        }
        Ok(())
    }

    /// Records a copy of `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
    ///
    /// Errors: [`VulkanError::Invalid`] when a range lies outside its buffer or a buffer belongs
    /// to another context.
    pub fn copy(
        &mut self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), VulkanError> {
        self.ctx.check_range(src, src_offset, len as usize)?;
        self.ctx.check_range(dst, dst_offset, len as usize)?;
        if len == 0 {
            return Ok(());
        }
        let region = [vk::BufferCopy {
            src_offset,
            dst_offset,
            size: len,
        }];
        let d = &self.ctx.shared.device;
        // SAFETY: both buffers belong to this device (checked above), have TRANSFER usage and
        // hold the ranges; `cmd` is recording.
        unsafe { d.cmd_copy_buffer(self.cmd, src.buffer, dst.buffer, &region) };
        self.barrier();
        Ok(())
    }

    /// Records filling all of `buffer` with the 4-byte word `word`.
    ///
    /// Errors: [`VulkanError::Invalid`] when the buffer belongs to another context.
    pub fn fill(&mut self, buffer: &Buffer, word: u32) -> Result<(), VulkanError> {
        self.fill_from(buffer, 0, word)
    }

    /// Records filling `buffer` from byte `offset` (a multiple of 4) to its end with the 4-byte
    /// word `word`; nothing when `offset` is the buffer's size.
    ///
    /// Errors: [`VulkanError::Invalid`] when the buffer belongs to another context, or `offset`
    /// is past its end or not a multiple of 4.
    pub fn fill_from(
        &mut self,
        buffer: &Buffer,
        offset: u64,
        word: u32,
    ) -> Result<(), VulkanError> {
        self.ctx.check_range(buffer, offset, 0)?;
        if !offset.is_multiple_of(4) {
            return Err(VulkanError::Invalid(format!(
                "a fill starts at byte {offset}, not a multiple of 4"
            )));
        }
        if offset == buffer.size {
            return Ok(());
        }
        // SAFETY: the buffer belongs to this device (checked above) and has TRANSFER_DST usage;
        // `offset` is a multiple of 4 below its size, WHOLE_SIZE fills whole words from there;
        // `cmd` is recording.
        unsafe {
            self.ctx.shared.device.cmd_fill_buffer(
                self.cmd,
                buffer.buffer,
                offset,
                vk::WHOLE_SIZE,
                word,
            )
        };
        self.barrier();
        Ok(())
    }

    /// Records resetting every timestamp of `ts` (before the run writes any).
    pub fn reset_timestamps(&mut self, ts: &Timestamps) {
        // SAFETY: the pool belongs to this device (made by its context); `cmd` is recording.
        unsafe {
            self.ctx
                .shared
                .device
                .cmd_reset_query_pool(self.cmd, ts.pool, 0, ts.count)
        };
    }

    /// Records timestamp `i` of `ts`, written once every earlier command has finished.
    ///
    /// Errors: [`VulkanError::Invalid`] past the pool.
    pub fn timestamp(&mut self, ts: &Timestamps, i: u32) -> Result<(), VulkanError> {
        if i >= ts.count {
            return Err(VulkanError::Invalid(format!(
                "timestamp {i} of a pool of {}",
                ts.count
            )));
        }
        // SAFETY: the pool belongs to this device, `i` is inside it and was reset in this
        // command buffer; `cmd` is recording.
        unsafe {
            self.ctx.shared.device.cmd_write_timestamp(
                self.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                ts.pool,
                i,
            )
        };
        Ok(())
    }

    /// Orders every later command after every earlier one's writes.
    fn barrier(&mut self) {
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE,
            )];
        // SAFETY: `cmd` is recording; the barrier outlives the call.
        unsafe {
            self.ctx.shared.device.cmd_pipeline_barrier(
                self.cmd,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            )
        };
    }
}

/// A command buffer recorded once ([`VulkanContext::record`]) for
/// [`VulkanContext::replay`], with the pool it came from; freed on drop.
pub struct Recording {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    shared: Arc<Shared>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        // SAFETY: no submission is in flight (each replay is waited for); destroying the pool
        // (made by this device, or null: a no-op) frees its command buffer.
        unsafe { self.shared.device.destroy_command_pool(self.pool, None) };
    }
}

/// A pool of GPU timestamps ([`VulkanContext::timestamps`]), freed on drop.
pub struct Timestamps {
    pool: vk::QueryPool,
    count: u32,
    shared: Arc<Shared>,
}

impl Drop for Timestamps {
    fn drop(&mut self) {
        // SAFETY: no submission is in flight (each is waited for); the pool was made by this
        // device.
        unsafe { self.shared.device.destroy_query_pool(self.pool, None) };
    }
}

/// Bytes of one `VkDispatchIndirectCommand` (three `u32` workgroup counts).
pub const INDIRECT_BYTES: usize = 12;

/// The one handle `call` was asked for (`ERROR_UNKNOWN` should a driver return none).
fn one<T>(call: &'static str, handles: Vec<T>) -> Result<T, VulkanError> {
    handles.into_iter().next().ok_or(VulkanError::Vk {
        call,
        result: vk::Result::ERROR_UNKNOWN,
    })
}

impl Drop for VulkanContext {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: nothing is in flight once the device is idle; the pool (with its command
        // buffer) and the fence were made by this device, or are null (a no-op).
        unsafe {
            let _ = d.device_wait_idle();
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.pool, None);
        }
    }
}

/// Where a [`Buffer`]'s memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Device-local memory: fastest for kernels; the host reaches it through copies.
    Device,
    /// Host-visible, coherent memory, mapped for the buffer's life: the host reads and writes it
    /// directly (kernels read it over the bus on a discrete GPU).
    Host,
    /// Host memory of the process imported as device memory (`VK_EXT_external_memory_host`):
    /// kernels read it in place over the bus; the host writes it through its own pointer, the
    /// context never does ([`VulkanContext::import_host`]).
    Imported,
}

/// A buffer of a [`VulkanContext`] with memory of its own, freed on drop.
pub struct Buffer {
    /// The buffer (null until made).
    buffer: vk::Buffer,
    /// Its memory (null until allocated).
    memory: vk::DeviceMemory,
    /// The mapping of a [`Location::Host`] buffer's memory, else null.
    mapped: *mut u8,
    /// Bytes.
    size: u64,
    /// Its device address.
    address: u64,
    /// Where its memory lives.
    location: Location,
    /// Bytes of its memory, counted in [`VulkanContext::memory_records`] while it lives.
    memory_bytes: u64,
    /// The heap it counts against and its bytes there, once counted.
    heap: Option<(usize, u64)>,
    /// The device, kept alive until the buffer is freed.
    shared: Arc<Shared>,
}

// SAFETY: the handles are plain identifiers; the only thread-sensitive member is the mapping
// of a host buffer, which is read and written only by `VulkanContext::upload` / `download`
// under the context's submission lock (one thread at a time, no submission in flight), and
// freed in `Drop`, which needs the buffer owned.
unsafe impl Send for Buffer {}
// SAFETY: as for `Send`: shared references reach the mapping only through the locked copies.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its device address: what a kernel receives (in push constants) to reach it through
    /// `GL_EXT_buffer_reference`.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Where its memory lives.
    pub fn location(&self) -> Location {
        self.location
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: no submission is in flight (each is waited for); the handles were made by this
        // device, or are null (a no-op); the memory is unmapped before it is freed.
        unsafe {
            if !self.mapped.is_null() {
                d.unmap_memory(self.memory);
            }
            d.destroy_buffer(self.buffer, None);
            d.free_memory(self.memory, None);
        }
        let record = match self.location {
            Location::Imported => &self.shared.imported,
            Location::Device | Location::Host => &self.shared.allocated,
        };
        record.fetch_sub(self.memory_bytes, Ordering::Relaxed);
        if let Some((heap, bytes)) = self.heap {
            self.shared.heaps[heap]
                .1
                .fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// A compute pipeline of a [`VulkanContext`] ([`VulkanContext::pipeline`]), destroyed on drop.
pub struct Pipeline {
    /// The pipeline (null until made).
    pipeline: vk::Pipeline,
    /// Its layout: one push-constant range, no descriptor sets (null until made).
    layout: vk::PipelineLayout,
    /// Bytes of push constants every dispatch passes.
    push_constant_bytes: u32,
    /// The device, kept alive until the pipeline is destroyed.
    shared: Arc<Shared>,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let d = &self.shared.device;
        // SAFETY: no submission is in flight (each is waited for); the handles were made by this
        // device, or are null (a no-op).
        unsafe {
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
        }
    }
}
