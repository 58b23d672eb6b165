"""What `--record`'s proxy costs a streamed answer.

One real llama-server b11434 (the generated target model, one slot) runs under `kvtrace capture run --record`, as a
user runs it: the capture reads the server's debug log and the recording proxy listens on the server's port, both
in kvtrace's own process, while the server moved to a private loopback port. The same streamed chat request
(temperature 0, `ignore_eos`, a fixed answer length) goes in pairs straight to the server's private port and
through the proxy, the pair's order alternating (direct first, then proxy first), so that each pair's two runs see
the same machine load. Per run: tokens/s as the client sees it, over the whole request and while streaming (from
the first chunk to the last), and each chunk's arrival after sending. Per pair: the proxied rate over the direct
one. The figure is the median of those pairwise ratios (target >= 0.98), with their quartiles; the latency added
is told before the first chunk and per chunk after it, as medians over the pairs, and the CPU the proxy takes per
chunk as the capture process's CPU time over the proxied runs less that over the direct ones (a figure a loaded
machine changes less than a rate).

    python benchmarks/proxy_cost.py [--pairs 20] [--tokens 1000] [--embd 64]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvtrace.analyze.reader.session import KEY_RECORD, MANIFEST, RAW_LOG, RECORDED, free_port
from kvtrace.capture.llama_server import find_llama_server
from kvtrace.capture.models import ModelParams, ensure_models
from kvtrace.capture.recording import read_records


@dataclass(slots=True)
class Run:
    seconds: float  # sending to the last chunk
    first: float  # sending to the first chunk
    chunks: int
    tokens: int

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def streaming_rate(self) -> float:  # the tokens after the first chunk, from the first chunk to the last
        return (self.tokens - self.tokens / self.chunks) / (self.seconds - self.first)


def stream_once(client: httpx.Client, url: str, tokens: int) -> Run:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "the cache and the draft of the target"}],
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                arrivals.append(time.perf_counter() - t0)
    return Run(arrivals[-1], arrivals[0], len(arrivals), tokens)


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user and system; Linux /proc, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_server(proxied: str, manifest: Path, proc: subprocess.Popen[bytes], timeout: float = 180) -> str:
    """The server's private address (from the session's manifest) once it answers /health through the proxy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the capture ended at start-up: {proc.communicate()[1].decode()[-2000:]}")
        try:
            server = json.loads(manifest.read_text()).get(KEY_RECORD, {}).get("server")
            if server and httpx.get(proxied + "/health", timeout=2).status_code == 200:
                return str(server)
        except (OSError, ValueError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not become healthy")


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="pairs of runs (one direct, one through the proxy)")
    ap.add_argument("--tokens", type=int, default=1000, help="answer tokens per run")
    ap.add_argument("--embd", type=int, default=64,
                    help="the generated target's width: 64 is the tests' tiny model (thousands of tokens/s); "
                         "512 generates at a real model's pace on a 2-core machine")
    args = ap.parse_args()
    server = find_llama_server()
    if server is None:
        print("llama-server is not built: `make server`", file=sys.stderr)
        return 2
    params = ModelParams() if args.embd == 64 else ModelParams(n_embd=args.embd, n_head=16, n_ff=4 * args.embd,
                                                                target_layers=8)
    pair = ensure_models(params=params)
    port = free_port()
    proxied = f"http://127.0.0.1:{port}"
    cmd = [str(server), "-m", str(pair.target), "-c", str(args.tokens + 64), "-np", "1", "-t", "1", "-fit", "off",
           "--host", "127.0.0.1", "--port", str(port)]
    kvtrace = Path(sys.executable).with_name("kvtrace")
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp) / "s"
        proc = subprocess.Popen([str(kvtrace), "capture", "run", "--record", "--quiet", "--out", str(session), "--",
                                 *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            direct = wait_for_server(proxied, session / MANIFEST, proc)
            runs: list[tuple[Run, Run]] = []  # (direct, proxy) per pair
            # the capture process's CPU while each way ran: reading the log both ways, and the proxy's work too
            cpu = {"direct": 0.0, "proxy": 0.0}

            def timed(way: str, url: str) -> Run:
                before = cpu_seconds(proc.pid)
                run = stream_once(client, url, args.tokens)
                cpu[way] += cpu_seconds(proc.pid) - before
                return run

            # a new connection for each request, both ways: llama-server closes a kept-alive one after a few
            # requests, and a client that reuses it then fails
            with httpx.Client(timeout=300, trust_env=False,
                              limits=httpx.Limits(max_keepalive_connections=0)) as client:
                stream_once(client, direct, 16)  # warm-up, both ways
                stream_once(client, proxied, 16)
                for i in range(args.pairs):
                    if i % 2 == 0:
                        d, p = timed("direct", direct), timed("proxy", proxied)
                    else:
                        p, d = timed("proxy", proxied), timed("direct", direct)
                    runs.append((d, p))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=120)
        recorded = read_records(session / RECORDED)
        log_mb = (session / RAW_LOG).stat().st_size / 1e6
    kept = [p.rate / d.rate for d, p in runs]
    kept_streaming = [p.streaming_rate / d.streaming_rate for d, p in runs]
    first = statistics.median(p.first - d.first for d, p in runs)
    per_chunk = statistics.median(((p.seconds - p.first) - (d.seconds - d.first)) / p.chunks for d, p in runs)
    chunks = statistics.median(p.chunks for _, p in runs)
    load = os.getloadavg()[0]
    print(f"llama-server b11434 under `kvtrace capture run --record`, generated target n_embd={args.embd}, 1 slot; "
          f"{args.pairs} pairs of streamed requests of {args.tokens} tokens ({chunks:.0f} chunks each); "
          f"{len(recorded)} requests recorded, {log_mb:.0f} MB of log captured; load average {load:.1f}")
    print(f"tokens/s, whole request:   direct {statistics.median(d.rate for d, _ in runs):8.1f}  "
          f"proxy {statistics.median(p.rate for _, p in runs):8.1f}")
    lo, mid, hi = quartiles(kept)
    print(f"kept, whole request:       median of the pairwise ratios {mid:.3f} (quartiles {lo:.3f} - {hi:.3f}; "
          "target >= 0.98)")
    lo, mid, hi = quartiles(kept_streaming)
    print(f"kept, while streaming:     median of the pairwise ratios {mid:.3f} (quartiles {lo:.3f} - {hi:.3f})")
    print(f"added before the first chunk: {first * 1000:.2f} ms; per chunk after it: {per_chunk * 1e6:.1f} us "
          "(medians over the pairs)")
    proxy_cpu = (cpu["proxy"] - cpu["direct"]) / sum(p.chunks for _, p in runs)
    print(f"kvtrace's CPU: {cpu['direct']:.2f} s over the direct runs (reading the log), {cpu['proxy']:.2f} s over "
          f"the proxied ones: the proxy's own {proxy_cpu * 1e6:.0f} us per chunk")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
