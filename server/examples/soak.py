#!/usr/bin/env python3
"""Soak test of a running `aubier serve`: N requests from a few concurrent clients, a random mix
of normal requests, streams (some dropped mid-way by the client), requests abandoned before the
answer, and bad inputs, against one server. Bounded in count (--requests) and in time
(--max-seconds); only 127.0.0.1 unless --url says otherwise. Python standard library only.

Each kind of request has the statuses it may get; anything else, a 5xx, a connection error
where an answer was due, a malformed SSE stream, or a stream that does not end with
`data: [DONE]` is an unexpected error. Reported: requests by kind, unexpected errors (the first
few in full), latency p50 / p99 (head to end of the answer, or to the disconnect), and the
server's resident memory at the start and end (from /proc/PID/status with --pid, else from
/metrics `process_resident_memory_bytes`) with checkpoints in between.

    python3 server/examples/soak.py --url http://127.0.0.1:8080 --requests 10000 --pid PID
"""

import argparse
import http.client
import json
import random
import re
import socket
import sys
import threading
import time
import urllib.parse


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--requests", type=int, default=10_000, help="requests in all")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent clients")
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--pid", type=int, help="server pid, to read its RSS from /proc")
    p.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens asked for")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--checkpoints", type=int, default=10, help="RSS readings during the run")
    return p.parse_args()


class Server:
    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            sys.exit(f"--url must be http://HOST:PORT, got {url}")
        self.host, self.port = u.hostname, u.port or 80
        self.timeout = timeout

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get(self, path):
        c = self.conn()
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


def rss_bytes(server, pid):
    if pid is not None:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")
    status, body = server.get("/metrics")
    m = re.search(rb"^process_resident_memory_bytes (\S+)$", body, re.M)
    if status != 200 or not m:
        raise RuntimeError("no process_resident_memory_bytes in /metrics")
    return int(float(m.group(1)))


class Unexpected(Exception):
    pass


WORDS = ["the", "lighthouse", "keeper", "Überfahrt", "naïve", "42", "😀", "é", "\n", "tide", "stone"]


def text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def chat_body(model, rng, **extra):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text(rng, 1, 30)}],
        "max_tokens": rng.randint(1, extra.pop("max_tokens_cap")),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "seed": rng.randint(0, 2**32),
    }
    body.update(extra)
    return body


def post(server, path, body, headers=None, raw=None):
    """Sends a POST; returns (status, response) with the response not yet read."""
    c = server.conn()
    data = raw if raw is not None else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=data, headers=h)
    return c, c.getresponse()


def expect(status, allowed, body=b""):
    if status not in allowed:
        raise Unexpected(f"status {status} (expected {sorted(allowed)}): {body[:300]!r}")


def read_sse(resp, stop_after=None):
    """Reads SSE events; checks framing; returns the number of events read. With `stop_after`,
    stops reading after that many events (the caller then drops the connection)."""
    events = 0
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            if not frame.startswith(b"data: "):
                raise Unexpected(f"SSE frame without 'data: ': {frame[:200]!r}")
            payload = frame[6:]
            events += 1
            if payload == b"[DONE]":
                if buf.strip():
                    raise Unexpected(f"data after [DONE]: {buf[:200]!r}")
                return events, True
            v = json.loads(payload)
            if "error" in v:
                raise Unexpected(f"error event: {payload[:300]!r}")
            if stop_after is not None and events >= stop_after:
                return events, False
    raise Unexpected(f"stream ended without [DONE] after {events} events")


def run_one(kind, server, model, rng, args):
    """Runs one request of `kind`; raises Unexpected on anything not allowed."""
    cap = args.max_tokens
    if kind == "chat":
        c, r = post(server, "/v1/chat/completions", chat_body(model, rng, max_tokens_cap=cap))
        body = r.read()
        expect(r.status, {200}, body)
        v = json.loads(body)
        if v["choices"][0]["finish_reason"] not in ("stop", "length"):
            raise Unexpected(f"finish_reason {v['choices'][0]['finish_reason']!r}")
    elif kind == "chat_stream":
        b = chat_body(model, rng, max_tokens_cap=cap, stream=True,
                      stream_options={"include_usage": rng.random() < 0.5})
        c, r = post(server, "/v1/chat/completions", b)
        expect(r.status, {200})
        read_sse(r)
    elif kind == "stream_dropped":
        b = chat_body(model, rng, max_tokens_cap=cap, stream=True)
        b["max_tokens"] = cap
        c, r = post(server, "/v1/chat/completions", b)
        expect(r.status, {200})
        read_sse(r, stop_after=rng.randint(1, 3))
        # Drop the connection mid-stream.
        r.close()
    elif kind == "completion":
        b = {"model": model, "prompt": text(rng, 1, 40), "max_tokens": rng.randint(1, cap),
             "stream": rng.random() < 0.5}
        c, r = post(server, "/v1/completions", b)
        expect(r.status, {200})
        if b["stream"]:
            read_sse(r)
        else:
            json.loads(r.read())
    elif kind == "abandoned":
        # The whole request, then the client leaves before the answer.
        data = json.dumps(chat_body(model, rng, max_tokens_cap=cap)).encode()
        s = socket.create_connection((server.host, server.port), timeout=args.timeout)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        time.sleep(rng.random() * 0.05)
        s.close()
        return
    elif kind == "bad":
        case = rng.choice(BAD)
        path, raw, headers, allowed = case(model, rng)
        c, r = post(server, path, None, headers=headers, raw=raw)
        body = r.read()
        expect(r.status, allowed, body)
        if "error" not in json.loads(body):
            raise Unexpected(f"no error object: {body[:200]!r}")
    elif kind == "probe":
        status, body = server.get(rng.choice(["/health", "/v1/models", "/metrics"]))
        expect(status, {200}, body)
        return
    else:
        raise ValueError(kind)
    c.close()


def bad_json(model, rng):
    return "/v1/chat/completions", b'{"model": "' + model.encode() + b'", "messages": [', {}, {400}


def bad_type(model, rng):
    b = {"model": model, "messages": [{"role": "user", "content": "x"}],
         "temperature": rng.choice(["hot", [], {}, -1, 3])}
    return "/v1/chat/completions", json.dumps(b).encode(), {}, {400}


def bad_model(model, rng):
    b = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    return "/v1/chat/completions", json.dumps(b).encode(), {}, {404}


def bad_param(model, rng):
    b = {"model": model, "prompt": "x", rng.choice(["frobnicate", "n", "echo"]): 3}
    return "/v1/completions", json.dumps(b).encode(), {}, {400}


def bad_top_p(model, rng):
    b = {"model": model, "messages": [{"role": "user", "content": "x"}],
         "top_p": rng.choice([5e-324, 1e-46, 0, 1.5])}
    return "/v1/chat/completions", json.dumps(b).encode(), {}, {400}


def bad_content_type(model, rng):
    b = {"model": model, "messages": [{"role": "user", "content": "x"}]}
    return "/v1/chat/completions", json.dumps(b).encode(), {"Content-Type": "text/plain"}, {415}


def bad_host(model, rng):
    b = {"model": model, "messages": [{"role": "user", "content": "x"}]}
    return "/v1/chat/completions", json.dumps(b).encode(), {"Host": "evil.example"}, {403}


def too_long(model, rng):
    b = {"model": model, "prompt": text(rng, 5000, 20000)}
    return "/v1/completions", json.dumps(b).encode(), {}, {400}


def bad_conversation(model, rng):
    b = {"model": model, "messages": [{"role": "assistant", "content": "x"}]}
    return "/v1/chat/completions", json.dumps(b).encode(), {}, {400}


BAD = [bad_json, bad_type, bad_model, bad_param, bad_top_p, bad_content_type, bad_host,
       too_long, bad_conversation]

KINDS = [("chat", 30), ("chat_stream", 20), ("stream_dropped", 10), ("completion", 15),
         ("abandoned", 5), ("bad", 15), ("probe", 5)]


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def main():
    args = parse_args()
    server = Server(args.url, args.timeout)
    status, body = server.get("/v1/models")
    if status != 200:
        sys.exit(f"GET /v1/models: {status} {body[:200]!r}")
    model = json.loads(body)["data"][0]["id"]
    rss_start = rss_bytes(server, args.pid)
    checkpoints = [(0, rss_start)]
    lock = threading.Lock()
    state = {"next": 0, "done": 0}
    counts, errors, latencies = {}, [], []
    names = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    t0 = time.monotonic()
    every = max(1, args.requests // max(1, args.checkpoints))

    def worker(wid):
        rng = random.Random(args.seed * 1000 + wid)
        while True:
            with lock:
                if state["next"] >= args.requests or time.monotonic() - t0 > args.max_seconds:
                    return
                state["next"] += 1
            kind = rng.choices(names, weights)[0]
            start = time.monotonic()
            err = None
            try:
                run_one(kind, server, model, rng, args)
            except Unexpected as e:
                err = str(e)
            except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
                err = f"{type(e).__name__}: {e}"
            elapsed = time.monotonic() - start
            with lock:
                counts[kind] = counts.get(kind, 0) + 1
                latencies.append(elapsed)
                if err is not None:
                    errors.append((kind, err))
                state["done"] += 1
                done = state["done"]
            if done % every == 0:
                try:
                    rss = rss_bytes(server, args.pid)
                except (OSError, RuntimeError) as e:
                    rss = None
                    with lock:
                        errors.append(("rss", str(e)))
                with lock:
                    checkpoints.append((done, rss))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    time.sleep(0.5)
    rss_end = rss_bytes(server, args.pid)
    latencies.sort()
    mib = lambda b: f"{b / 2**20:.1f} MiB" if b is not None else "?"
    print(f"requests: {state['done']} in {wall:.1f} s ({args.concurrency} clients), by kind: "
          + ", ".join(f"{k} {counts.get(k, 0)}" for k in names))
    print(f"unexpected errors: {len(errors)}")
    for kind, e in errors[:10]:
        print(f"  {kind}: {e}")
    print(f"latency: p50 {percentile(latencies, 0.5) * 1e3:.1f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1e3:.1f} ms")
    print(f"RSS: start {mib(rss_start)}, end {mib(rss_end)} "
          f"({(rss_end - rss_start) / rss_start * 100:+.1f}%)")
    print("RSS checkpoints: " + ", ".join(f"{n}: {mib(r)}" for n, r in checkpoints))
    print(json.dumps({
        "requests": state["done"], "seconds": round(wall, 1), "by_kind": counts,
        "unexpected_errors": len(errors), "p50_ms": round(percentile(latencies, 0.5) * 1e3, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1e3, 1), "rss_start": rss_start,
        "rss_end": rss_end, "checkpoints": checkpoints,
    }))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
