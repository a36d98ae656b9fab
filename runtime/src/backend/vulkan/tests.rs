//! The device layer on a real device: lavapipe (Mesa's Vulkan on the CPU) in CI, which installs
//! it, so a machine without a Vulkan device fails these tests instead of skipping them.

use super::context::{Location, VulkanContext};
use super::device::{list_devices, select, DeviceInfo};
use super::shader::compile_glsl;
use super::{VulkanError, INSTALL_HINT};
use std::collections::HashMap;

/// The devices of this machine; panics with the install hint without one.
fn devices() -> Vec<DeviceInfo> {
    list_devices()
        .unwrap_or_else(|e| panic!("these tests need a Vulkan device (CI installs lavapipe): {e}"))
}

/// A context on the device [`select`] picks, software allowed (lavapipe without a GPU).
fn context() -> VulkanContext {
    let device = select(None, true).unwrap_or_else(|e| panic!("selecting a device: {e}"));
    VulkanContext::new(device.index)
        .unwrap_or_else(|e| panic!("opening device {} ({}): {e}", device.index, device.name))
}

#[test]
fn vulkan_lists_lavapipe_with_subgroups_and_limits() {
    let devices = devices();
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.index, i);
        assert!(!d.name.is_empty());
        assert!(d.subgroup_size >= 1, "{d:?}");
        assert!(d.subgroup_operations.contains(&"basic"), "{d:?}");
        assert!(d.limits.max_storage_buffer_range > 0, "{d:?}");
        assert!(d.limits.max_compute_work_group_invocations >= 128, "{d:?}");
        assert!(!d.heaps.is_empty(), "{d:?}");
    }
    let lavapipe = devices
        .iter()
        .find(|d| d.name.contains("llvmpipe"))
        .unwrap_or_else(|| panic!("no llvmpipe among {devices:?}: {INSTALL_HINT}"));
    assert!(lavapipe.is_software());
    assert!(lavapipe.api_version.starts_with("1.3"), "{lavapipe:?}");
    let f = lavapipe.features;
    assert!(
        f.buffer_device_address && f.storage_buffer_8bit_access,
        "{f:?}"
    );
    assert!(lavapipe.subgroup_operations.contains(&"arithmetic"));
    let json = serde_json::to_value(lavapipe).unwrap();
    assert_eq!(json["device_type"], "cpu");
    assert_eq!(json["features"]["buffer_device_address"], true);
}

#[test]
fn vulkan_select_runs_software_only_when_named_or_allowed() {
    let devices = devices();
    let chosen = select(None, true).unwrap();
    if devices.iter().all(DeviceInfo::is_software) {
        assert_eq!(chosen.index, 0);
        let e = select(None, false).unwrap_err().to_string();
        assert!(e.contains("no hardware Vulkan device"), "{e}");
        assert!(e.contains("llvmpipe"), "{e}");
    } else {
        assert!(!chosen.is_software());
    }
    let last = devices.len() - 1;
    assert_eq!(select(Some(last), false).unwrap().index, last);
    let e = select(Some(devices.len()), true).unwrap_err();
    assert!(matches!(e, VulkanError::Selection { .. }), "{e}");
}

/// Reads N bytes through a buffer device address (8-bit storage); writes each as an f32 and,
/// per invocation, the `subgroupAdd` of its subgroup's bytes and the subgroup's tag.
const BYTES_KERNEL: &str = r#"#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 1) readonly buffer Bytes { uint8_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Words { uint v[]; };
layout(push_constant) uniform Args { Bytes src; Floats dst; Words sums; Words tags; uint n; } args;
void main() {
    uint i = gl_GlobalInvocationID.x;
    uint x = 0u;
    if (i < args.n) {
        x = uint(args.src.v[i]);
        args.dst.v[i] = float(x);
    }
    args.sums.v[i] = subgroupAdd(x);
    args.tags.v[i] = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
}
"#;

/// `bytes` as little-endian u32 / f32 words.
fn words(bytes: &[u8]) -> impl Iterator<Item = [u8; 4]> + '_ {
    bytes.chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]])
}

#[test]
fn vulkan_kernel_reads_bytes_by_device_address_and_sums_subgroups() {
    let ctx = context();
    let spirv = compile_glsl(BYTES_KERNEL, "bytes.comp").unwrap_or_else(|e| panic!("{e}"));
    let pipeline = ctx.pipeline(&spirv, 36).unwrap();

    const N: usize = 1000; // not a multiple of the 64 invocations of a workgroup
    let groups = N.div_ceil(64);
    let lanes = groups * 64;
    let input: Vec<u8> = (0..N).map(|i| ((i * 37 + 11) % 256) as u8).collect();
    let src = ctx.buffer(N as u64, Location::Device).unwrap();
    let dst = ctx.buffer(4 * N as u64, Location::Device).unwrap();
    let sums = ctx.buffer(4 * lanes as u64, Location::Host).unwrap();
    let tags = ctx.buffer(4 * lanes as u64, Location::Host).unwrap();
    ctx.upload(&src, 0, &input).unwrap();
    let addresses = [&src, &dst, &sums, &tags].map(|b| b.address());
    assert!(addresses.iter().all(|&a| a != 0), "{addresses:x?}");

    let mut push = Vec::new();
    for a in addresses {
        push.extend_from_slice(&a.to_le_bytes());
    }
    push.extend_from_slice(&(N as u32).to_le_bytes());
    ctx.dispatch(&pipeline, [groups as u32, 1, 1], &push)
        .unwrap();

    let mut out = vec![0u8; 4 * N];
    ctx.download(&dst, 0, &mut out).unwrap();
    for (i, w) in words(&out).enumerate() {
        assert_eq!(f32::from_le_bytes(w), f32::from(input[i]), "element {i}");
    }

    let mut sums_bytes = vec![0u8; 4 * lanes];
    let mut tags_bytes = vec![0u8; 4 * lanes];
    ctx.download(&sums, 0, &mut sums_bytes).unwrap();
    ctx.download(&tags, 0, &mut tags_bytes).unwrap();
    let sums: Vec<u32> = words(&sums_bytes).map(u32::from_le_bytes).collect();
    let tags: Vec<u32> = words(&tags_bytes).map(u32::from_le_bytes).collect();
    // The CPU sum of each subgroup (invocations past N add 0), the subgroups as the device
    // formed them (their tags).
    let mut expected: HashMap<u32, (u32, usize)> = HashMap::new();
    for (i, &tag) in tags.iter().enumerate() {
        let e = expected.entry(tag).or_default();
        e.0 += input.get(i).map_or(0, |&b| u32::from(b));
        e.1 += 1;
    }
    for (i, (&sum, tag)) in sums.iter().zip(&tags).enumerate() {
        assert_eq!(sum, expected[tag].0, "invocation {i}, subgroup {tag}");
    }
    let members = expected.values().map(|&(_, n)| n).max().unwrap_or(0);
    let subgroup = ctx.info().subgroup_size as usize;
    assert!(
        members > 1 || subgroup == 1,
        "every subgroup had one invocation (subgroupSize {subgroup})"
    );
    assert!(members <= 64);
}

#[test]
fn vulkan_context_refuses_bad_arguments() {
    let ctx = context();
    let buf = ctx.buffer(16, Location::Device).unwrap();
    assert_eq!(buf.size(), 16);
    assert_eq!(buf.location(), Location::Device);

    // Round trip at an offset, through the staging copies.
    ctx.upload(&buf, 3, &[1, 2, 3, 4, 5]).unwrap();
    let mut back = [0u8; 5];
    ctx.download(&buf, 3, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3, 4, 5]);

    let invalid = |r: Result<(), VulkanError>, what: &str| match r {
        Err(VulkanError::Invalid(m)) => assert!(m.contains(what), "{m}"),
        other => panic!("expected Invalid({what}), got {other:?}"),
    };
    invalid(
        ctx.upload(&buf, 12, &[0; 5]),
        "outside the buffer of 16 bytes",
    );
    invalid(ctx.download(&buf, u64::MAX, &mut [0; 1]), "outside");
    assert!(matches!(
        ctx.buffer(0, Location::Host),
        Err(VulkanError::Invalid(_))
    ));
    assert!(matches!(
        ctx.pipeline(&[1, 2, 3, 4, 5, 6], 0),
        Err(VulkanError::Invalid(_))
    ));

    let spirv = compile_glsl(BYTES_KERNEL, "bytes.comp").unwrap();
    assert!(matches!(
        ctx.pipeline(&spirv, 6),
        Err(VulkanError::Invalid(_))
    ));
    let pipeline = ctx.pipeline(&spirv, 36).unwrap();
    invalid(
        ctx.dispatch(&pipeline, [1, 1, 1], &[0; 32]),
        "32 bytes of push constants for a pipeline taking 36",
    );
    invalid(
        ctx.dispatch(&pipeline, [u32::MAX, 1, 1], &[0; 36]),
        "maxComputeWorkGroupCount",
    );

    let other = context();
    invalid(other.upload(&buf, 0, &[0]), "another Vulkan context");
    invalid(
        other.dispatch(&pipeline, [0, 0, 0], &[0; 36]),
        "another Vulkan context",
    );
    match VulkanContext::new(usize::MAX) {
        Err(VulkanError::Selection { reason, found }) => {
            assert!(reason.contains("names no Vulkan device"), "{reason}");
            assert!(!found.is_empty());
        }
        Err(e) => panic!("expected Selection, got {e}"),
        Ok(_) => panic!("expected Selection, got a context"),
    }
}

/// A `vulkan` backend on a device that does not exist binds for [`WARP`] and says so in its
/// name and in every step's variant; its load fails naming the device it asked for.
#[test]
fn vulkan_without_its_device_binds_for_the_default_width_and_says_so() {
    use crate::backend::{Backend, LoadInput};
    use crate::gguf::GgufFile;
    use crate::store::FastBudget;
    use crate::weights::Weights;
    use aubier_compiler::{compile, CompileOptions, Target};
    use aubier_kernels_gen::gpu::emit::WARP;
    use std::sync::Arc;

    let backend = super::VulkanBackend::new(Some(usize::MAX));
    let name = backend.name();
    assert_eq!(
        name,
        format!("vulkan (no device; binds for subgroup {WARP})")
    );
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf");
    let file = Arc::new(GgufFile::open(&path).expect("bundled model"));
    let cfg = crate::model::read_config(&file).expect("config");
    let refs = crate::model::weight_refs(&file, &cfg).expect("weights");
    let opts = CompileOptions {
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    let plan = Arc::new(compile(&cfg, &refs, &opts).expect("plan"));
    let binding = backend.bind(&plan).expect("binds without a device");
    assert!(binding
        .steps
        .iter()
        .all(|s| s.choice.variant == "none (in place)"
            || s.choice.variant.ends_with(&format!("; subgroup {WARP}"))));
    let weights = Arc::new(Weights::bind(Arc::clone(&file), &plan).expect("weights"));
    let input = LoadInput {
        plan: &plan,
        binding: &binding,
        weights: &weights,
        budget: FastBudget::Auto,
    };
    let e = backend
        .load(&input, &mut crate::progress::Quiet)
        .expect_err("no such device")
        .to_string();
    assert!(
        e.contains(&format!("--device {} names no Vulkan device", usize::MAX)),
        "{e}"
    );
}

#[test]
fn vulkan_allocations_never_exceed_their_heap() {
    let ctx = context();
    let left = ctx.heap_left(Location::Device);
    let heap = ctx.info().device_heap().expect("a device-local heap");
    assert!(left > 0 && left <= heap, "{left} of {heap}");
    let half = left / 2 + 4096;
    let first = ctx.buffer(half, Location::Device).expect("half the heap");
    assert!(ctx.heap_left(Location::Device) <= left - half);
    match ctx.buffer(half, Location::Device) {
        Err(VulkanError::OutOfMemory { wanted, taken, .. }) => {
            assert!(wanted >= half && taken >= half, "{wanted} {taken}");
        }
        other => panic!("a second half of the heap: {:?}", other.map(|b| b.size())),
    }
    drop(first);
    assert_eq!(ctx.heap_left(Location::Device), left);
}
