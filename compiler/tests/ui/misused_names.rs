use aubier_compiler::model;

model! {
    fn graph(eps: f32, w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        let y = x + w.output_norm;
        let z = silu(undefined);
        let p = phase(x);
        let s = split(x; [1, 2]);
        output "y" = y;
    }
}

fn main() {}
