//! Lowering of a verified graph to the [`Plan`]: schedule, value and weight numbering, storage.
//!
//! Algorithm note.
//! 1. Order: [`Graph::topo_order`] (Kahn, smallest ready node id first), so the same graph always
//!    gives the same steps. Every non-weight node becomes a value, numbered in that order; every
//!    op node becomes a step; weights are numbered by first use.
//! 2. Live ranges, in positions: inputs are defined at 0, step `k` at `k + 1`; a value lives from
//!    its definition to its last reader, and an output lives to `n_steps + 1` (read after the
//!    last step). Two ranges overlap when they share a position, so a step never writes the slot
//!    of a value it reads.
//! 3. Alias classes: a `reshape` output is the same buffer as its input, so each reshape chain
//!    forms one class whose range is the union of its members' ranges. A class rooted at a
//!    `cache_write` lives in `Storage::KvCache { layer }`; every other class gets a slot (a
//!    `phase` writes the cache as a side effect, but its value is the query and takes a slot;
//!    fused steps are otherwise scheduled like any op, attributes included).
//! 4. Slots (greedy by size, as in Pisarchyk & Lee 2020, "Efficient Memory Management for Deep
//!    Neural Net Inference", §4.3 "shared objects"): a slot's buffer is as large as its largest
//!    occupant, so what counts is the sum of slot sizes, not their number. Classes are taken
//!    largest first (ties: earlier start, then lower root id); each goes to the smallest slot
//!    already at least its size whose occupants' ranges all miss its own, else to the largest
//!    such slot (which grows), else to a new slot. Sizes are symbolic in T and S, so they are
//!    compared at [`SIZE_REF_T`] × [`SIZE_REF_S`]; the choice only moves bytes between slots,
//!    never lets two live values meet. (Plain first-fit colouring gave the three [T, H, S]
//!    attention-score values of the scale → mask → softmax chain three slots; two suffice.)

use crate::config::Mistral4Config;
use crate::error::CompileError;
use crate::ir::{Graph, NodeId, NodeKind};
use crate::ops::Op;
use crate::plan::{Operand, OutputHead, Plan, Step, Storage, Value, ValueId, WeightId};
use crate::types::Attrs;
use crate::verify::VerifyError;
use std::collections::BTreeMap;

/// The extents at which symbolic value sizes are compared when slots are assigned: a long prefill
/// over its own keys, where the [T, H, S] attention scores rank as the largest values (as they do
/// in any prefill over more than a few dozen keys).
pub const SIZE_REF_T: usize = 4096;
/// See [`SIZE_REF_T`].
pub const SIZE_REF_S: usize = 4096;

/// One alias class that needs a buffer slot: live over positions `start..=end`, `size` elements
/// at the reference extents.
#[derive(Clone, Copy, Debug)]
struct SlotClass {
    root: ValueId,
    start: usize,
    end: usize,
    size: usize,
}

/// Greedy-by-size slot assignment (algorithm note, step 4): class root → slot, and the number of
/// slots.
fn assign_slots(classes: &[SlotClass]) -> (BTreeMap<ValueId, usize>, usize) {
    let mut order: Vec<&SlotClass> = classes.iter().collect();
    order.sort_by_key(|c| (std::cmp::Reverse(c.size), c.start, c.root));
    // Per slot: its size and its occupants' ranges.
    let mut slots: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    let mut slot_of = BTreeMap::new();
    for c in order {
        let free = |(_, ranges): &(usize, Vec<(usize, usize)>)| {
            ranges.iter().all(|&(s, e)| e < c.start || c.end < s)
        };
        let fitting = slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| free(slot) && slot.0 >= c.size)
            .min_by_key(|(i, slot)| (slot.0, *i))
            .map(|(i, _)| i);
        let growing = || {
            slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| free(slot))
                .max_by_key(|(i, slot)| (slot.0, std::cmp::Reverse(*i)))
                .map(|(i, _)| i)
        };
        let i = match fitting.or_else(growing) {
            Some(i) => i,
            None => {
                slots.push((0, Vec::new()));
                slots.len() - 1
            }
        };
        slots[i].0 = slots[i].0.max(c.size);
        slots[i].1.push((c.start, c.end));
        slot_of.insert(c.root, i);
    }
    (slot_of, slots.len())
}

/// Schedules `g` (already verified) into a [`Plan`] for `config`; `stages` records the pipeline.
///
/// Errors: [`CompileError::Verify`] (stage `schedule`) on a cycle; [`CompileError::Untyped`] when
/// a value has no inferred type.
pub fn schedule(
    g: &Graph,
    config: &Mistral4Config,
    stages: Vec<String>,
) -> Result<Plan, CompileError> {
    let order = g.topo_order().map_err(|left| CompileError::Verify {
        stage: "schedule".to_string(),
        source: VerifyError::Cycle {
            nodes: left
                .iter()
                .map(|&n| g.label(n))
                .collect::<Vec<_>>()
                .join(", "),
        },
    })?;

    let mut value_of: BTreeMap<NodeId, ValueId> = BTreeMap::new();
    let mut values: Vec<Value> = Vec::new();
    let mut weight_of: BTreeMap<NodeId, WeightId> = BTreeMap::new();
    let mut weights = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    // Per value: the alias-class root (a value id) and the definition position.
    let mut root: Vec<ValueId> = Vec::new();
    let mut def: Vec<usize> = Vec::new();
    let mut last_use: Vec<usize> = Vec::new();
    let mut cache_layer: BTreeMap<ValueId, usize> = BTreeMap::new();

    for &n in &order {
        let Some(node) = g.node(n) else { continue };
        if matches!(node.kind, NodeKind::Weight(_)) {
            continue;
        }
        let ty = node
            .ty
            .clone()
            .ok_or_else(|| CompileError::Untyped { node: g.label(n) })?;
        let id = values.len();
        value_of.insert(n, id);
        values.push(Value {
            dtype: ty.dtype,
            shape: ty.shape,
            storage: Storage::Slot(0),
            name: node.name.clone(),
        });
        root.push(id);
        let NodeKind::Op { op, attrs } = &node.kind else {
            def.push(0);
            last_use.push(0);
            continue;
        };
        let position = steps.len() + 1;
        def.push(position);
        last_use.push(position);
        let mut args = Vec::new();
        for a in g.operands(n) {
            if let Some(&v) = value_of.get(&a) {
                last_use[v] = position;
                args.push(Operand::Value(v));
            } else if let Some(NodeKind::Weight(w)) = g.node(a).map(|x| &x.kind) {
                let wid = *weight_of.entry(a).or_insert_with(|| {
                    weights.push(w.clone());
                    weights.len() - 1
                });
                args.push(Operand::Weight(wid));
            } else {
                return Err(CompileError::Untyped { node: g.label(a) });
            }
        }
        match (op, attrs) {
            (Op::Reshape, _) => {
                if let Some(Operand::Value(src)) = args.first() {
                    root[id] = root[*src];
                }
            }
            (Op::CacheWrite, Attrs::CacheWrite { layer }) => {
                cache_layer.insert(id, *layer);
            }
            _ => {}
        }
        steps.push(Step {
            op: *op,
            attrs: attrs.clone(),
            args,
            out: id,
        });
    }

    let end = steps.len() + 1;
    let mut outputs = Vec::new();
    for (name, n) in &g.outputs {
        let v = *value_of
            .get(n)
            .ok_or_else(|| CompileError::Untyped { node: g.label(*n) })?;
        last_use[v] = end;
        outputs.push((name.clone(), v));
    }
    let inputs = g
        .inputs
        .iter()
        .filter_map(|n| {
            let v = *value_of.get(n)?;
            Some((values[v].name.clone(), v))
        })
        .collect();

    // Alias classes: root value → its live range and largest member at the reference extents.
    let mut class: BTreeMap<ValueId, SlotClass> = BTreeMap::new();
    for (v, value) in values.iter().enumerate() {
        let r = root[v];
        let c = class.entry(r).or_insert(SlotClass {
            root: r,
            start: def[r],
            end: last_use[r],
            size: 0,
        });
        c.start = c.start.min(def[v]);
        c.end = c.end.max(last_use[v]);
        c.size = c.size.max(value.shape.numel(SIZE_REF_T, SIZE_REF_S));
    }
    let slotted: Vec<SlotClass> = class
        .into_values()
        .filter(|c| !cache_layer.contains_key(&c.root))
        .collect();
    let (slot_of, n_slots) = assign_slots(&slotted);
    for (v, value) in values.iter_mut().enumerate() {
        let r = root[v];
        value.storage = match cache_layer.get(&r) {
            Some(&layer) => Storage::KvCache { layer },
            None => Storage::Slot(slot_of.get(&r).copied().unwrap_or(0)),
        };
    }

    let output_head = g.output_head.and_then(|n| {
        let value = *value_of.get(&n)?;
        let step = steps.iter().position(|s| s.out == value)?;
        Some(OutputHead { step, value })
    });
    Ok(Plan {
        config: config.clone(),
        stages,
        weights,
        values,
        n_slots,
        inputs,
        outputs,
        steps,
        output_head,
    })
}

#[cfg(test)]
mod tests {
    use super::{assign_slots, SlotClass};

    fn class(root: usize, start: usize, end: usize, size: usize) -> SlotClass {
        SlotClass {
            root,
            start,
            end,
            size,
        }
    }

    /// A small value live across the start of a chain of three large ones: lowest-slot-first
    /// colouring gives all three large values their own slot (301 elements); taking the large
    /// ones first needs two large slots and one small (201), the least any assignment can do,
    /// since the large values at positions 2 and the small one at 1..=2 are live together.
    #[test]
    fn large_classes_are_placed_first_and_share_slots() {
        let classes = [
            class(0, 0, 2, 1),
            class(1, 1, 2, 100),
            class(2, 2, 3, 100),
            class(3, 3, 4, 100),
        ];
        let (slot_of, n) = assign_slots(&classes);
        let mut size = vec![0; n];
        for c in &classes {
            size[slot_of[&c.root]] = size[slot_of[&c.root]].max(c.size);
        }
        assert_eq!(size.iter().sum::<usize>(), 201);
        for a in &classes {
            for b in &classes {
                if a.root < b.root && slot_of[&a.root] == slot_of[&b.root] {
                    assert!(a.end < b.start || b.end < a.start, "{a:?} meets {b:?}");
                }
            }
        }
    }
}
