use aubier_compiler::model;
use aubier_compiler::types::WeightRef;
use std::collections::BTreeMap;

model! {
    /// A two-layer toy: embedding, a residual RMSNorm·SiLU block per layer, and logits.
    pub fn toy(n_layer: usize, eps: f32, w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        for l in 0..n_layer {
            let (a, b) = split(rms_norm(x, w.blk[l].attn_norm; eps); [2, 2]);
            x = x + concat(silu(a) * b, a);
        }
        output "logits" = mat_mul(w.output, x);
    }
}

fn weight(m: &mut BTreeMap<String, WeightRef>, name: &str, ne: &[usize]) {
    m.insert(name.into(), WeightRef { name: name.into(), ggml_type: "F32".into(), ne: ne.to_vec() });
}

fn main() {
    let mut m = BTreeMap::new();
    weight(&mut m, "token_embd.weight", &[4, 10]);
    weight(&mut m, "output.weight", &[4, 10]);
    weight(&mut m, "blk.0.attn_norm.weight", &[4]);
    weight(&mut m, "blk.1.attn_norm.weight", &[4]);
    let g = toy(2, 1e-6, &m).unwrap();
    assert_eq!(g.outputs.len(), 1);
    assert!(matches!(
        toy(3, 1e-6, &m),
        Err(aubier_compiler::CompileError::MissingWeight { .. })
    ));
}
