use aubier_compiler::model;

model! {
    fn graph(n_layer: usize, eps: f32, w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        for l in 0..n_layer {
            let h = rms_norm(x, w.blk[l].attn_nrom; eps);
            x = x + h;
        }
        let y = rms_norm(x, w.attn_norm; eps);
        output "y" = y;
    }
}

fn main() {}
