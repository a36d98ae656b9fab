use aubier_compiler::model;

model! {
    fn graph(eps: f32, w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        let h = rms_norm(x, w.output_norm, x; eps);
        output "h" = h;
    }
}

fn main() {}
