//! The Vulkan device as an executor of the kernel cases: each kernel printed in the Vulkan
//! dialect (`gpu::glsl`), compiled in process (`compile_glsl`, the runtime's SPIR-V cache),
//! made a pipeline once per distinct source (cases that build the same kernel share it) and
//! dispatched under the ABI of `glsl.rs`'s module note (device addresses in push constants,
//! then that of the extents `T`, `S` in device memory). Kernels are built at the device's subgroup size, the only width at which the
//! IR's butterfly is the device's. A machine without a Vulkan device fails with the install
//! hint, never skips.
//!
//! The device is opened once per core ("lanes"): lavapipe compiles a pipeline's code (LLVM)
//! at its first dispatch, in the queue of its device, so one context compiles one kernel at a
//! time; a thread runs on the lane it is pinned to ([`Device::pin`], else lane 0), and
//! pipelines are shared within a lane.

use super::exec::{kind, Exec, Ops};
use aubier_kernels_gen::gpu::cpu_exec::Arg;
use aubier_kernels_gen::gpu::glsl::{push_constant_bytes, render_glsl};
use aubier_kernels_gen::gpu::ir::{Kernel, Stmt};
use aubier_runtime::backend::vulkan_device::compile_glsl;
use aubier_runtime::backend::vulkan_device::select;
use aubier_runtime::backend::vulkan_device::{Buffer, Location, Pipeline, VulkanContext};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

/// Vulkan's accuracy (the spec's "Precision and Operation of SPIR-V Instructions"): `x / y`
/// within 2.5 ulp; `sqrt` inherited from `1.0 / inversesqrt(x)`, i.e. inversesqrt's 2 ulp
/// (`4u` relative) then the division's 2.5 ulp (`5u`): `9u`, 4.5 ulp to first order.
pub const VULKAN_OPS: Ops = Ops {
    div_ulp: 2.5,
    sqrt_ulp: 4.5,
};

/// What one step kind cost on the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct KindStats {
    /// Kernel runs that dispatched work (a grid of no blocks, the other form of a weight
    /// product, is not a run).
    pub runs: usize,
    /// Pipelines made (distinct sources).
    pub pipelines: usize,
    /// Seconds in [`Exec::run`]: GLSL, SPIR-V, pipeline, uploads, dispatch, downloads.
    pub secs: f64,
}

/// A Vulkan device running kernels: one context per lane, the pipelines of each lane by source,
/// and what each step kind cost.
pub struct Device {
    lanes: Vec<VulkanContext>,
    pipelines: Mutex<HashMap<(usize, String), Arc<Pipeline>>>,
    stats: Mutex<BTreeMap<String, KindStats>>,
}

thread_local! {
    /// The lane this thread runs on.
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// The device `select` picks, software allowed (lavapipe without a GPU), opened once per test
/// binary, once per core. Panics when there is none.
pub fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| {
        let info = select(None, true).unwrap_or_else(|e| {
            panic!(
                "these tests need a Vulkan device (CI installs lavapipe: \
                 apt-get install -y mesa-vulkan-drivers libvulkan1): {e}"
            )
        });
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let lanes = (0..cores)
            .map(|_| {
                VulkanContext::new(info.index).unwrap_or_else(|e| {
                    panic!("opening device {} ({}): {e}", info.index, info.name)
                })
            })
            .collect();
        Device {
            lanes,
            pipelines: Mutex::new(HashMap::new()),
            stats: Mutex::new(BTreeMap::new()),
        }
    })
}

/// Whether `body` holds a subgroup reduction.
fn reduces(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::WarpReduce(..) => true,
        Stmt::For { body, .. } => reduces(body),
        Stmt::If(_, a, b) => reduces(a) || reduces(b),
        _ => false,
    })
}

impl Device {
    /// Lanes: contexts on the device, one per core.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Runs this thread's kernels on lane `lane % lanes`.
    pub fn pin(&self, lane: usize) {
        LANE.with(|l| l.set(lane % self.lanes.len()));
    }

    /// This thread's lane and its context.
    fn lane(&self) -> (usize, &VulkanContext) {
        let lane = LANE.with(Cell::get);
        (lane, &self.lanes[lane])
    }

    /// The device's description.
    pub fn info(&self) -> &aubier_runtime::backend::vulkan_device::DeviceInfo {
        self.lanes[0].info()
    }

    /// What each step kind ([`kind`]) run so far cost.
    pub fn stats(&self) -> BTreeMap<String, KindStats> {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The pipeline of `k`'s source on `lane`, made on first use; whether it was made now.
    fn pipeline(&self, lane: usize, ctx: &VulkanContext, k: &Kernel) -> (Arc<Pipeline>, bool) {
        let key = (lane, render_glsl(k, &[]).unwrap_or_else(|e| panic!("{e}")));
        let made = self
            .pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = made.get(&key) {
            return (Arc::clone(p), false);
        }
        // Compile without the lock: two threads compiling one source make it twice, which is
        // only time.
        drop(made);
        let spirv = compile_glsl(&key.1, &format!("{}.comp", k.name))
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", k.name, key.1));
        let p = Arc::new(
            ctx.pipeline(&spirv, push_constant_bytes(k))
                .unwrap_or_else(|e| panic!("{}: {e}", k.name)),
        );
        self.pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Arc::clone(&p));
        (p, true)
    }
}

/// A device buffer of `ctx` holding `bytes`.
fn upload(ctx: &VulkanContext, bytes: &[u8]) -> Buffer {
    let buf = ctx
        .buffer(bytes.len().max(4) as u64, Location::Device)
        .expect("buffer");
    if !bytes.is_empty() {
        ctx.upload(&buf, 0, bytes).expect("upload");
    }
    buf
}

impl Exec for Device {
    fn widths(&self) -> Vec<u32> {
        vec![self.info().subgroup_size]
    }

    /// Uploads every argument (an experts table: each expert's own buffer and a table of their
    /// addresses), dispatches the grid, waits, and downloads the f32 / i32 arguments.
    fn run(&self, k: &Kernel, args: &mut [Arg<'_>], t: usize, s: usize) {
        let start = Instant::now();
        let (lane, ctx) = self.lane();
        let subgroup = ctx.info().subgroup_size;
        assert!(
            !reduces(&k.body) || k.warp == subgroup,
            "kernel `{}` reduces over {} lanes; the device's subgroup has {subgroup}",
            k.name,
            k.warp
        );
        assert_eq!(args.len(), k.params.len(), "{}: arguments", k.name);
        let (pipeline, made) = self.pipeline(lane, ctx, k);
        // Buffers live until the dispatch is done; `experts` holds each expert's own buffer.
        let mut bufs = Vec::new();
        let mut experts = Vec::new();
        for a in args.iter() {
            let bytes: Vec<u8> = match a {
                Arg::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Arg::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Arg::Weight(b) => b.to_vec(),
                Arg::Experts(list) => {
                    let own: Vec<Buffer> = list.iter().map(|b| upload(ctx, b)).collect();
                    let table = own.iter().flat_map(|b| b.address().to_le_bytes()).collect();
                    experts.push(own);
                    table
                }
            };
            bufs.push(upload(ctx, &bytes));
        }
        let mut push: Vec<u8> = bufs
            .iter()
            .flat_map(|b| b.address().to_le_bytes())
            .collect();
        let extents: Vec<u8> = [t as i32, s as i32]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let extents = upload(ctx, &extents);
        push.extend_from_slice(&extents.address().to_le_bytes());
        let grid = k.grid.clone().map(|g| g.eval(t, s).expect("grid") as u32);
        if !grid.contains(&0) {
            ctx.dispatch(&pipeline, [grid[0], grid[1], 1], &push)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        }
        for (a, buf) in args.iter_mut().zip(&bufs) {
            let n = match a {
                Arg::F32(v) => v.len(),
                Arg::I32(v) => v.len(),
                _ => continue,
            };
            let mut bytes = vec![0u8; 4 * n];
            if n > 0 {
                ctx.download(buf, 0, &mut bytes).expect("download");
            }
            let words = bytes.chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]]);
            match a {
                Arg::F32(v) => v
                    .iter_mut()
                    .zip(words)
                    .for_each(|(x, w)| *x = f32::from_le_bytes(w)),
                Arg::I32(v) => v
                    .iter_mut()
                    .zip(words)
                    .for_each(|(x, w)| *x = i32::from_le_bytes(w)),
                _ => {}
            }
        }
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let e = stats.entry(kind(k)).or_default();
        e.runs += usize::from(!grid.contains(&0));
        e.pipelines += made as usize;
        e.secs += start.elapsed().as_secs_f64();
    }

    fn ops(&self) -> Ops {
        VULKAN_OPS
    }
}
