//! `aubier devices [--json]`: the Vulkan devices of this machine with the limits and features
//! a generated kernel depends on (`aubier_runtime::backend::vulkan_device::list_devices`).
//!
//! Exit status: 0 with at least one device; 1 without the Vulkan loader or a device, with a
//! message saying what to install.

use aubier_runtime::backend::vulkan_device::{list_devices, DeviceInfo};
use clap::Args;

/// Arguments of `aubier devices`.
#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Print a JSON array of devices instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `aubier devices`.
///
/// Errors: no loader, no device, a failed Vulkan query, a failed write to stdout.
pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    let devices = list_devices()?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&devices)?);
        return Ok(());
    }
    for d in &devices {
        print_device(d)?;
    }
    Ok(())
}

/// One device as text: a heading line, then one `label  value` line per property.
fn print_device(d: &DeviceInfo) -> anyhow::Result<()> {
    let l = &d.limits;
    let f = &d.features;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let software = if d.is_software() { " (software)" } else { "" };
    let heaps = d
        .heaps
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let local = if h.device_local { " device-local" } else { "" };
            format!("{i}: {}{local}", mib(h.size))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let host_memory = match l.min_imported_host_pointer_alignment {
        Some(a) => format!(" (minImportedHostPointerAlignment {a} bytes)"),
        None => String::new(),
    };
    let [sx, sy, sz] = l.max_compute_work_group_size;
    let [cx, cy, cz] = l.max_compute_work_group_count;
    outln!("device {}: {}", d.index, d.name);
    outln!("  type             {}{software}", d.device_type.as_str());
    outln!("  vulkan           {}", d.api_version);
    outln!("  driver           {} {}", d.driver_version, d.driver);
    outln!(
        "  subgroup         {} invocations; {}",
        d.subgroup_size,
        d.subgroup_operations.join(" ")
    );
    outln!(
        "  storage buffer   {} per binding (maxStorageBufferRange)",
        mib(u64::from(l.max_storage_buffer_range))
    );
    let stated = |v: Option<u64>| v.map_or_else(|| "not stated".into(), mib);
    outln!(
        "  one buffer       {} per allocation (maxMemoryAllocationSize), {} (maxBufferSize)",
        stated(l.max_memory_allocation_size),
        stated(l.max_buffer_size)
    );
    outln!(
        "  shared memory    {} bytes per workgroup",
        l.max_compute_shared_memory_size
    );
    outln!(
        "  workgroup        {} invocations, size {sx}×{sy}×{sz}, count {cx}×{cy}×{cz}",
        l.max_compute_work_group_invocations
    );
    outln!("  push constants   {} bytes", l.max_push_constants_size);
    outln!("  heaps            {heaps}");
    outln!(
        "  features         shaderFloat16 {}, shaderInt8 {}, storageBuffer8BitAccess {}, \
         storageBuffer16BitAccess {}, bufferDeviceAddress {}",
        yes(f.shader_float16),
        yes(f.shader_int8),
        yes(f.storage_buffer_8bit_access),
        yes(f.storage_buffer_16bit_access),
        yes(f.buffer_device_address)
    );
    outln!(
        "  host memory      VK_EXT_external_memory_host {}{host_memory}",
        yes(f.external_memory_host)
    );
    Ok(())
}

/// `bytes` in MiB with one decimal (`128.0 MiB`).
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
