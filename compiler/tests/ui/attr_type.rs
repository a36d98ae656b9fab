use aubier_compiler::model;

model! {
    fn graph(w: weights) {
        input tokens: [T] i32;
        let x = embed(w.token_embd, tokens);
        let ids = top_k(softmax(x); 2.5);
        output "ids" = ids;
    }
}

fn main() {}
