//! The backend seam from outside the runtime crate: a backend defined here — its own binding,
//! load, runs, expert-slot memory and counters — registered through the public registry, runs
//! the bundled model end to end with the oracle's logits, bit for bit.
//!
//! The backend (`seam`) runs each step through the oracle's public kernels (the cranelift
//! lowering of `aubier_kernels_gen::cpu` over `aubier_runtime::gguf::quant::host_symbols`), one
//! thread, with its own buffers and its own latent cache, and keeps the fast store's slots in
//! memory of its own: one `Vec<u8>` per MoE layer, filled by the store through
//! `aubier_runtime::store::SlotMemory`. Its default budget holds a quarter of the experts, so the
//! store rotates them: the test sees promotions, evictions, reads from the host store (the mapped
//! file) and a served fraction strictly between 0 and 1, while the logits of a prefill and of
//! the decode steps after it equal the oracle's.

use aubier_compiler::ops::Op;
use aubier_compiler::plan::{MoeLayer, Operand, Plan, Storage, ValueId};
use aubier_compiler::types::DType;
use aubier_compiler::Target;
use aubier_kernels_gen::cpu::{CpuProgram, IndexBound, StepArgs};
use aubier_runtime::backend::registry::{self, Auto, BackendEntry, BackendSpec};
use aubier_runtime::backend::{
    Backend, BackendError, BindError, Binding, BoundStep, Experts, KernelChoice, KernelTime,
    LoadInput, Loaded, LoadedModel, Output, Run, RunCounters, StepInput,
};
use aubier_runtime::engine::Model;
use aubier_runtime::gguf::quant::host_symbols;
use aubier_runtime::progress::Progress;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::{SlotMemory, StoreError};
use aubier_runtime::weights::Weights;
use aubier_tests::{data_dir, json_ids, models_dir, read_json};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// The seam backend.
#[derive(Debug)]
struct SeamBackend;

/// What its binding carries: nothing but its own type (every step is the oracle's kernels).
#[derive(Debug)]
struct SeamBinding;

/// The name it binds under.
const NAME: &str = "seam";

fn err(detail: impl ToString) -> BackendError {
    BackendError::Binding {
        backend: NAME.into(),
        detail: detail.to_string(),
    }
}

impl Backend for SeamBackend {
    fn name(&self) -> String {
        NAME.into()
    }

    fn target(&self) -> Target {
        Target::Oracle
    }

    fn bind(&self, plan: &Plan) -> Result<Binding, BindError> {
        let steps = plan
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.op.is_fused() {
                    return Err(BindError {
                        backend: NAME.into(),
                        step: i,
                        op: s.op.name(),
                        reason: "the seam backend runs unfused plans".into(),
                    });
                }
                Ok(BoundStep {
                    choice: KernelChoice {
                        kernel: "seam_cranelift",
                        variant: "the oracle's public kernels, one thread".into(),
                    },
                    one_token_matches_prefill: true,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Binding::new(NAME.into(), steps, SeamBinding))
    }

    fn load(&self, input: &LoadInput<'_>, _: &mut dyn Progress) -> Result<Loaded, BackendError> {
        input
            .binding
            .kernels::<SeamBinding>()
            .ok_or_else(|| err("a binding of another backend"))?;
        let plan = Arc::clone(input.plan);
        let program = CpuProgram::compile(&plan, &host_symbols())?;
        let moe = plan.moe_layers().map_err(err)?;
        let n_expert = moe.first().map_or(0, |l| l.n_expert);
        let per_slot: u64 = moe.iter().map(|l| l.expert_bytes() as u64).sum();
        let n_res = input.budget.slots(per_slot, n_expert, || n_expert / 4)?;
        let slots = SeamSlots {
            weights: Arc::clone(input.weights),
            arenas: moe
                .iter()
                .map(|l| vec![0u8; n_res * l.expert_bytes()])
                .collect(),
            moe: moe.clone(),
            slots: n_res,
            fills: 0,
        };
        let model = SeamModel {
            plan,
            weights: Arc::clone(input.weights),
            program,
            moe,
        };
        Ok(Loaded {
            model: Arc::new(model),
            slots: Box::new(slots),
        })
    }
}

/// The fast store's slots: per MoE layer, `slots` experts back to back, each its tensors back
/// to back, in the file's layout.
#[derive(Debug)]
struct SeamSlots {
    weights: Arc<Weights>,
    arenas: Vec<Vec<u8>>,
    moe: Vec<MoeLayer>,
    slots: usize,
    fills: u64,
}

impl SeamSlots {
    /// Tensor `tensor` of slot `slot` of MoE layer `layer`.
    fn bytes(&self, layer: usize, slot: usize, tensor: usize) -> Option<&[u8]> {
        let l = self.moe.get(layer)?;
        let offset: usize = l.tensors[..tensor].iter().map(|t| t.expert_bytes).sum();
        let len = l.tensors.get(tensor)?.expert_bytes;
        let at = slot * l.expert_bytes() + offset;
        self.arenas.get(layer)?.get(at..at + len)
    }
}

impl SlotMemory for SeamSlots {
    fn slots(&self) -> usize {
        self.slots
    }

    fn bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.len() as u64).sum()
    }

    fn slot_bytes(&self) -> u64 {
        self.moe.iter().map(|l| l.expert_bytes() as u64).sum()
    }

    fn fill(&mut self, layer: usize, slot: usize, expert: u32) -> Result<(), StoreError> {
        let bad = |reason: &str| StoreError::Slot {
            layer,
            slot,
            reason: reason.into(),
        };
        let l = self.moe.get(layer).ok_or_else(|| bad("no such layer"))?;
        if slot >= self.slots {
            return Err(bad("no such slot"));
        }
        let mut at = slot * l.expert_bytes();
        for t in &l.tensors {
            let view = self
                .weights
                .view(t.weight)
                .ok_or_else(|| bad("no weight"))?;
            let src = view
                .get(expert as usize * t.expert_bytes..)
                .and_then(|v| v.get(..t.expert_bytes))
                .ok_or_else(|| bad("no such expert"))?;
            self.arenas[layer][at..at + t.expert_bytes].copy_from_slice(src);
            at += t.expert_bytes;
        }
        self.fills += 1;
        Ok(())
    }

    fn read_back(&self, layer: usize, slot: usize, tensor: usize) -> Result<Vec<u8>, StoreError> {
        self.bytes(layer, slot, tensor)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| StoreError::Slot {
                layer,
                slot,
                reason: "out of range".into(),
            })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The plan, its weights and its cranelift program.
#[derive(Debug)]
struct SeamModel {
    plan: Arc<Plan>,
    weights: Arc<Weights>,
    program: CpuProgram,
    moe: Vec<MoeLayer>,
}

impl LoadedModel for SeamModel {
    fn open(self: Arc<Self>, kv_max: usize) -> Result<Box<dyn Run>, BackendError> {
        let cfg = &self.plan.config;
        let cache = vec![vec![0f32; kv_max * cfg.kv_cache_width()]; cfg.n_layer];
        let n_slots = self.plan.n_slots;
        let steps = self.plan.steps.len();
        Ok(Box::new(SeamRun {
            model: self,
            buffers: vec![Vec::new(); n_slots],
            cache,
            kv_max,
            tables: Vec::new(),
            scratch: Vec::new(),
            times: vec![(0.0, 0.0, 0); steps],
            steps: 0,
        }))
    }
}

/// One session's buffers and latent cache.
#[derive(Debug)]
struct SeamRun {
    model: Arc<SeamModel>,
    /// One f32 buffer per plan slot (i32 values as bit patterns).
    buffers: Vec<Vec<f32>>,
    /// Per layer, `[kv_max, width]`.
    cache: Vec<Vec<f32>>,
    kv_max: usize,
    tables: Vec<Vec<u64>>,
    scratch: Vec<f32>,
    /// Per step: prefill seconds, decode seconds, runs.
    times: Vec<(f64, f64, u64)>,
    steps: u64,
}

impl SeamRun {
    /// The address of value `id`'s first element.
    fn value(&mut self, plan: &Plan, id: ValueId) -> *mut u8 {
        match plan.values[id].storage {
            Storage::Slot(n) => self.buffers[n].as_mut_ptr().cast(),
            Storage::KvCache { layer } => self.cache[layer].as_mut_ptr().cast(),
        }
    }
}

impl Run for SeamRun {
    fn step(
        &mut self,
        input: &StepInput<'_>,
        experts: &Experts<'_>,
    ) -> Result<Vec<Output>, BackendError> {
        let model = Arc::clone(&self.model);
        let (plan, program) = (&*model.plan, &model.program);
        let (t, s) = (input.tokens, input.keys);
        if t == 0 || t > s || s > self.kv_max {
            return Err(err(format!("T = {t}, S = {s}, capacity {}", self.kv_max)));
        }
        let slots = experts.slots_as::<SeamSlots>(NAME)?;
        for v in &plan.values {
            if let Storage::Slot(n) = v.storage {
                let need = v.shape.numel(t, s);
                if self.buffers[n].len() < need {
                    self.buffers[n].resize(need, 0.0);
                }
            }
        }
        for (name, id) in &plan.inputs {
            let (_, data) = input
                .inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| err(format!("no input `{name}`")))?;
            let Storage::Slot(n) = plan.values[*id].storage else {
                return Err(err("an input outside the slots"));
            };
            for (dst, &x) in self.buffers[n].iter_mut().zip(data.iter()) {
                *dst = f32::from_bits(x as u32);
            }
        }
        for (i, step) in plan.steps.iter().enumerate() {
            let started = Instant::now();
            let cs = &program.steps()[i];
            let mut args = StepArgs::new(t, s, 0, 0);
            for (j, a) in step.args.iter().enumerate() {
                args.args[j] = match a {
                    Operand::Value(v) => self.value(plan, *v),
                    Operand::Weight(w) => model
                        .weights
                        .view(*w)
                        .ok_or_else(|| err("weight"))?
                        .as_ptr(),
                };
            }
            for check in &cs.checks {
                let Some(Operand::Value(v)) = step.args.get(check.arg) else {
                    return Err(err("an index operand that is not a value"));
                };
                let bound = match check.bound {
                    IndexBound::Below(n) => n,
                    IndexBound::Keys => s,
                };
                let Storage::Slot(n) = plan.values[*v].storage else {
                    return Err(err("an index operand outside the slots"));
                };
                let len = plan.values[*v].shape.numel(t, s);
                if self.buffers[n][..len]
                    .iter()
                    .any(|x| usize::try_from(x.to_bits() as i32).map_or(true, |id| id >= bound))
                {
                    return Err(err(format!("step {i}: {} out of range", check.what)));
                }
            }
            if step.op == Op::MoeFfn {
                let (li, layer) = model
                    .moe
                    .iter()
                    .enumerate()
                    .find(|(_, l)| l.step == i)
                    .ok_or_else(|| err("a moe_ffn step the plan's MoE layers do not name"))?;
                self.tables.resize(layer.tensors.len(), Vec::new());
                for (tj, (table, tensor)) in self.tables.iter_mut().zip(&layer.tensors).enumerate()
                {
                    let view = model
                        .weights
                        .view(tensor.weight)
                        .ok_or_else(|| err("weight"))?;
                    table.clear();
                    for e in 0..layer.n_expert {
                        let bytes = match experts.store.slot_of(li, e) {
                            Some(slot) => slots.bytes(li, slot, tj).ok_or_else(|| err("slot"))?,
                            None => &view[e * tensor.expert_bytes..],
                        };
                        table.push(bytes.as_ptr() as u64);
                    }
                    args.args[tensor.arg] = table.as_ptr().cast();
                }
            }
            args.out = self.value(plan, step.out);
            let scratch = cs.scratch.eval(t, s).ok_or_else(|| err("scratch"))?;
            if self.scratch.len() < scratch {
                self.scratch.resize(scratch, 0.0);
            }
            args.scratch = self.scratch.as_mut_ptr();
            for kernel in &cs.kernels {
                let work = kernel.work().eval(t, s).ok_or_else(|| err("work"))?;
                let call = StepArgs {
                    begin: 0,
                    end: work,
                    ..args
                };
                // SAFETY: every operand and output points to a buffer sized for its value at
                // (T, S), the latent cache holds `kv_max ≥ S` rows, weights are the file's views
                // of the plan's byte lengths, expert tables hold an address per expert of whole
                // experts, the scratch is sized, the index checks above passed, and this one
                // thread is the only one running.
                unsafe { kernel.call(&call) };
            }
            let spent = started.elapsed().as_secs_f64();
            let time = &mut self.times[i];
            if t > 1 {
                time.0 += spent;
            } else {
                time.1 += spent;
            }
            time.2 += 1;
        }
        self.steps += 1;
        input
            .outputs
            .iter()
            .map(|&id| {
                let v = &plan.values[id];
                let Storage::Slot(n) = v.storage else {
                    return Err(err("an output outside the slots"));
                };
                let len = v.shape.numel(t, s);
                let mut data = self.buffers[n][..len].to_vec();
                if input.last_only == Some(id) {
                    data.drain(..len - len / t);
                }
                Ok(match v.dtype {
                    DType::F32 => Output::F32(data),
                    DType::I32 => Output::I32(data.iter().map(|x| x.to_bits() as i32).collect()),
                })
            })
            .collect()
    }

    fn truncate(&mut self, rows: usize) -> Result<(), BackendError> {
        let width = self.model.plan.config.kv_cache_width();
        for layer in &mut self.cache {
            let keep = (rows * width).min(layer.len());
            layer[keep..].fill(0.0);
        }
        Ok(())
    }

    fn cache_row(&self, layer: usize, pos: usize) -> Result<Vec<f32>, BackendError> {
        let width = self.model.plan.config.kv_cache_width();
        self.cache
            .get(layer)
            .and_then(|c| c.get(pos * width..(pos + 1) * width))
            .map(<[f32]>::to_vec)
            .ok_or_else(|| err("outside the cache"))
    }

    fn profile(&mut self, on: bool) -> Result<(), BackendError> {
        if on {
            self.times.iter_mut().for_each(|t| *t = (0.0, 0.0, 0));
            self.steps = 0;
        }
        Ok(())
    }

    fn counters(&self) -> RunCounters {
        RunCounters {
            times: self
                .times
                .iter()
                .enumerate()
                .map(|(step, &(prefill_s, decode_s, launches))| KernelTime {
                    step,
                    kernel: "seam_cranelift".into(),
                    prefill_s,
                    decode_s,
                    launches,
                    weights: self.model.plan.steps[step].weights().collect(),
                })
                .collect(),
            steps: self.steps,
            ..RunCounters::default()
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A prefill of 24 tokens, then 12 decode steps: every logit's bits, and the session.
fn run(model: Arc<Model>) -> (Vec<u32>, Session) {
    let ids = json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    );
    let mut s = Session::open(model, SessionOptions { kv_max: 64 }).expect("session");
    s.profile(true).expect("profile");
    let mut logits = s.step(&ids[..24]).expect("prefill");
    for &id in &ids[24..36] {
        logits.extend(s.step(&[id]).expect("decode"));
    }
    (bits(&logits), s)
}

#[test]
fn a_backend_outside_the_runtime_runs_the_bundled_model_with_the_oracles_logits() {
    registry::register(BackendEntry {
        name: NAME,
        about: "a backend of the seam test: the oracle's public kernels, slots of its own",
        options: &[],
        auto: Auto::Never,
        make: |_| Ok(Arc::new(SeamBackend)),
    })
    .expect("registered");
    assert!(registry::entries().iter().any(|e| e.name == NAME));
    let path = models_dir().join("ms4-tiny256-q2k.gguf");
    let seam = Model::load_with(&path, &BackendSpec::named(NAME)).expect("the seam backend loads");
    assert_eq!(seam.backend_name(), NAME);
    assert!(seam.binding().one_token_runs_match_prefill());
    let oracle = Model::load_with(&path, &BackendSpec::named("oracle")).expect("the oracle");
    let (want, _) = run(oracle);
    let (got, s) = run(Arc::clone(&seam));
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the seam backend's logits differ from the oracle's"
    );

    let r = s.store_report();
    let n_expert = seam.config.n_expert;
    assert_eq!(r.n_res, n_expert / 4, "a quarter of the experts resident");
    assert!(r.promotions > 0, "{r:?}");
    assert!(r.evictions > 0, "{r:?}");
    assert!(r.fast_hits < r.routed, "reads from the host store: {r:?}");
    assert!(r.served_fraction > 0.0 && r.served_fraction < 1.0, "{r:?}");
    let c = s.counters();
    assert_eq!(c.steps, 13, "one prefill and 12 decode steps");
    assert_eq!(c.times.len(), seam.plan.steps.len());
    assert!(c
        .times
        .iter()
        .all(|k| k.kernel == "seam_cranelift" && k.launches == 13));
    assert!(c.times.iter().any(|k| k.prefill_s > 0.0) && c.times.iter().any(|k| k.decode_s > 0.0));
    let slots = seam.slots().lock();
    let own = slots
        .memory()
        .as_any()
        .downcast_ref::<SeamSlots>()
        .expect("the model's slots are the seam backend's");
    assert!(
        own.fills >= r.promotions,
        "the store filled the backend's own memory"
    );
    assert_eq!(
        slots.memory().bytes(),
        own.arenas.iter().map(|a| a.len() as u64).sum::<u64>()
    );
}
