"""llama.cpp's side of the CPU speed comparison in docs/BENCHMARKS.md (issue 7).

Measures what `aubier bench` measures, on the same GGUF, with the same prompt and thread count:
the bundled English text tokenized by llama.cpp (BOS first), its text tokens repeated or cut to
--n-prompt tokens; per rep: clear the KV cache, prefill the prompt in one llama_decode (logits of
the last position only, as llama-bench does), then --n-gen greedy decode steps of one token.
Prefill tok/s = n_prompt / prefill time; decode tok/s = (n_gen - 1) / time of the decode steps
after the first sampled token (as aubier's decode loop counts it); TTFT = prefill + first argmax.
Peak RSS is getrusage(RUSAGE_SELF).ru_maxrss of this Python process.

Needs llama-cpp-python (a local tool, never a CI dependency):
    python3 -m venv venv && CMAKE_ARGS="-DGGML_NATIVE=ON" venv/bin/pip install llama-cpp-python==0.3.36
Run:
    venv/bin/python docs/llamacpp_bench.py MODEL.gguf [--repack 0|1] [--threads 2]
        [--n-prompt 512] [--n-gen 128] [--reps 5] [--prompt-file server/data/alice.txt]
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time

import llama_cpp as L
import numpy as np


def spread(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repack", type=int, default=0, help="use_extra_bufts (weight repacking)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-file", default=os.path.join(here, "..", "server", "data", "alice.txt"))
    a = ap.parse_args()

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept alive for the process
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = bool(a.repack)
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {a.model}")
    cp = L.llama_context_default_params()
    cp.n_ctx = a.n_prompt + a.n_gen
    cp.n_batch = a.n_prompt
    cp.n_ubatch = a.n_prompt
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    text = open(a.prompt_file, "rb").read()
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    ids = list(buf[:n])
    bos = L.llama_vocab_bos(vocab)
    head, body = (ids[:1], ids[1:]) if ids and ids[0] == bos else ([], ids)
    prompt = (head + body * (a.n_prompt // max(len(body), 1) + 1))[: a.n_prompt]

    def step(tokens):
        arr = (L.llama_token * len(tokens))(*tokens)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(tokens))) != 0:
            sys.exit("llama_decode failed")
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    prefill, decode, ttft = [], [], []
    for _ in range(a.reps):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        tok = step(prompt)
        t1 = time.perf_counter()
        for _ in range(a.n_gen - 1):
            tok = step([tok])
        t2 = time.perf_counter()
        prefill.append(len(prompt) / (t1 - t0))
        decode.append((a.n_gen - 1) / (t2 - t1) if a.n_gen > 1 else 0.0)
        ttft.append((t1 - t0) * 1e3)
    print(json.dumps({
        "engine": "llama.cpp (llama-cpp-python " + L.__version__ + ")",
        "model": a.model,
        "repack": bool(a.repack),
        "threads": a.threads,
        "n_prompt": len(prompt),
        "n_gen": a.n_gen,
        "reps": a.reps,
        "prefill_tok_s": spread(prefill),
        "decode_tok_s": spread(decode),
        "ttft_ms": spread(ttft),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    main()
