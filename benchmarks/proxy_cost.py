"""What `--record`'s proxy costs the client: tokens/s kept and latency added per streamed chunk.

One real llama-server (`make server`, the tiny target model, one slot) and the recording proxy in front of it, in
this process as `capture run --record` runs it. The same streamed chat request (temperature 0, `ignore_eos`, a
fixed answer length) goes alternately straight to the server and through the proxy, so both see the same machine
load. Per request: tokens/s as the client sees it, over the whole request and while streaming (from the first
chunk to the last), and each chunk's arrival time after the request was sent. The proxy's added latency is told
before the first chunk (once a request) and per chunk after it ((added by the last chunk - added before the
first) / chunks); the kept rate is the proxied tokens/s over the direct one (target >= 0.98).

    python benchmarks/proxy_cost.py [--requests 12] [--tokens 256] [--embd 64]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvtrace.analyze.reader.session import RECORDED, free_port
from kvtrace.capture.llama_server import find_llama_server
from kvtrace.capture.models import ModelParams, ensure_models
from kvtrace.capture.proxy import RecordingProxy
from kvtrace.capture.recording import read_records


def stream_once(client: httpx.Client, url: str, tokens: int) -> tuple[float, list[float], int]:
    """(seconds to the last chunk, each chunk's arrival after sending, answer tokens)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "the cache and the draft of the target"}],
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                arrivals.append(time.perf_counter() - t0)
    return arrivals[-1], arrivals, tokens


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("llama-server exited at start-up")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("llama-server did not become healthy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12, help="requests each way (alternating)")
    ap.add_argument("--tokens", type=int, default=256, help="answer tokens per request")
    ap.add_argument("--embd", type=int, default=64,
                    help="the generated target's width: 64 is the tests' tiny model (thousands of tokens/s); "
                         "1024 with 8 layers generates at a real model's pace on this machine")
    args = ap.parse_args()
    server = find_llama_server()
    if server is None:
        print("llama-server is not built: `make server`", file=sys.stderr)
        return 2
    params = ModelParams() if args.embd == 64 else ModelParams(n_embd=args.embd, n_head=16, n_ff=4 * args.embd,
                                                                target_layers=8)
    pair = ensure_models(params=params)
    port, proxy_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{port}"
    cmd = [str(server), "-m", str(pair.target), "-c", "2048", "-np", "1", "-t", "1", "-fit", "off",
           "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proxy = RecordingProxy("127.0.0.1", proxy_port, direct, Path(tmp) / RECORDED)
        try:
            wait_healthy(direct, proc)
            proxy.start()
            proxied = f"http://127.0.0.1:{proxy_port}"
            runs: dict[str, list[tuple[float, list[float], int]]] = {"direct": [], "proxy": []}
            with httpx.Client(timeout=300, trust_env=False) as client:
                stream_once(client, direct, 16)  # warm-up, both ways
                stream_once(client, proxied, 16)
                for i in range(args.requests * 2):
                    way = ("direct", "proxy")[i % 2] if (i // 2) % 2 == 0 else ("proxy", "direct")[i % 2]
                    runs[way].append(stream_once(client, direct if way == "direct" else proxied, args.tokens))
        finally:
            stats = proxy.stop()
            proc.terminate()
            proc.wait(30)
        recorded = read_records(Path(tmp) / RECORDED)
    rate = {w: statistics.median(n / s for s, _, n in r) for w, r in runs.items()}
    # while streaming: the answer's tokens after the first chunk over the time from the first chunk to the last
    streaming = {w: statistics.median((n - n / len(a)) / (a[-1] - a[0]) for _, a, n in r) for w, r in runs.items()}
    pairs = list(zip(runs["direct"], runs["proxy"], strict=True))
    first = statistics.median(p[1][0] - d[1][0] for d, p in pairs)  # added before the first chunk
    last = statistics.median(p[0] - d[0] for d, p in pairs)  # added by the last chunk
    chunks = statistics.median(len(a) for _, a, _ in runs["proxy"])
    per_chunk_us = (last - first) / chunks * 1e6
    print(f"llama-server b11434, generated target n_embd={args.embd}, 1 slot, {args.requests} streamed requests "
          f"each way of {args.tokens} tokens ({chunks:.0f} chunks each); {stats.requests} recorded by the proxy "
          f"({len(recorded)} lines)")
    print(f"tokens/s, whole request:  direct {rate['direct']:8.1f}  proxy {rate['proxy']:8.1f}  "
          f"kept {rate['proxy'] / rate['direct']:.3f}")
    print(f"tokens/s, while streaming: direct {streaming['direct']:8.1f}  proxy {streaming['proxy']:8.1f}  "
          f"kept {streaming['proxy'] / streaming['direct']:.3f} (target >= 0.98)")
    print(f"added before the first chunk: {first * 1000:.2f} ms; by the last chunk: {last * 1000:.2f} ms; "
          f"per chunk after the first: {per_chunk_us:.1f} us (medians over requests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
