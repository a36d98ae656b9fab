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
//! 4. Slots: classes by (start, root value id); each takes the lowest-numbered slot whose last
//!    occupant's range ended before the class starts, or a new slot (greedy interval colouring,
//!    optimal in slot count for interval graphs).

use crate::config::Mistral4Config;
use crate::error::CompileError;
use crate::ir::{Graph, NodeId, NodeKind};
use crate::ops::Op;
use crate::plan::{Operand, Plan, Step, Storage, Value, ValueId, WeightId};
use crate::types::Attrs;
use crate::verify::VerifyError;
use std::collections::BTreeMap;

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

    // Alias classes: root value → (start, end).
    let mut class: BTreeMap<ValueId, (usize, usize)> = BTreeMap::new();
    for v in 0..values.len() {
        let r = root[v];
        let e = class.entry(r).or_insert((def[r], last_use[r]));
        e.0 = e.0.min(def[v]);
        e.1 = e.1.max(last_use[v]);
    }
    let mut by_start: Vec<(usize, ValueId, usize)> = class
        .iter()
        .filter(|(r, _)| !cache_layer.contains_key(r))
        .map(|(&r, &(s, e))| (s, r, e))
        .collect();
    by_start.sort();
    let mut slot_end: Vec<usize> = Vec::new();
    let mut slot_of: BTreeMap<ValueId, usize> = BTreeMap::new();
    for (start, r, e) in by_start {
        let slot = match slot_end.iter().position(|&busy| busy < start) {
            Some(s) => s,
            None => {
                slot_end.push(0);
                slot_end.len() - 1
            }
        };
        slot_end[slot] = e;
        slot_of.insert(r, slot);
    }
    for (v, value) in values.iter_mut().enumerate() {
        let r = root[v];
        value.storage = match cache_layer.get(&r) {
            Some(&layer) => Storage::KvCache { layer },
            None => Storage::Slot(slot_of.get(&r).copied().unwrap_or(0)),
        };
    }

    Ok(Plan {
        config: config.clone(),
        stages,
        weights,
        values,
        n_slots: slot_end.len(),
        inputs,
        outputs,
        steps,
    })
}
