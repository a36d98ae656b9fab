use aubier_compiler::model;

model! {
    fn graph(w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        let heads = reshape(x; [T, 4, 64]);
        let flat = reshape(x; [T, 256]);
        let bad = heads + flat;
        let wide = reshape(x; [T, 2, 128]);
        let worse = heads * wide;
        output "bad" = bad;
        output "worse" = worse;
    }
}

fn main() {}
