"""Helpers for the record/replay tests: a recorded capture driven by the official `openai` client."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kvtrace.capture.recording import RecordedRequest, read_records
from tests.capture.capture_helpers import start_kvtrace, wait_for


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def recorded_capture(out: Path, server_cmd: list[str], port: int, cwd: Path,
                     kvtrace: tuple[str, ...] = ("capture", "run", "--record")) -> Iterator[None]:
    """`kvtrace capture run --record` around server_cmd (listening on `port`), or another recording command
    (`kvtrace`, then no server_cmd): the body drives it through the proxy; Ctrl-C ends the capture as a user's
    would."""
    proc = start_kvtrace(*kvtrace, "--quiet", "--out", str(out), *(["--", *server_cmd] if server_cmd else []),
                         cwd=cwd)
    try:
        deadline = time.monotonic() + 240
        while not healthy(port) and proc.poll() is None:  # each poll is recorded too: a user's client polls so
            assert time.monotonic() < deadline, "the recorded server did not become healthy"
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err.decode()[-3000:]  # ended by Ctrl-C, as a user ends it


def replay(*args: str, cwd: Path, timeout: float = 300) -> tuple[int, dict[str, Any] | None, str]:
    """`kvtrace replay ARGS --json`: (exit code, the JSON it printed or None, stderr)."""
    from tests.capture.capture_helpers import run_kvtrace

    proc = run_kvtrace("replay", *args, cwd=cwd, timeout=timeout)
    out = proc.stdout.decode().strip()
    return proc.returncode, (json.loads(out.splitlines()[-1]) if out else None), proc.stderr.decode()


def positions(records: list[RecordedRequest], key: Callable[[RecordedRequest], int]) -> dict[int, tuple[int, int]]:
    """Each answered request's target positions from its response's `timings`: where its prompt ended (cached
    and evaluated tokens) and where its answer ended."""
    out = {}
    for r in records:
        t = r.timings or {}
        if r.cancelled or "prompt_n" not in t:
            continue
        prompt = int(t["prompt_n"]) + int(t.get("cache_n", 0))
        out[key(r)] = (prompt, prompt + int(t["predicted_n"]))
    return out


def recorded_positions(folder: Path, name: str = "requests.jsonl") -> dict[int, tuple[int, int]]:
    return positions(read_records(folder / name), lambda r: r.id)


def replayed_positions(folder: Path) -> dict[int, tuple[int, int]]:
    def of(r: RecordedRequest) -> int:
        assert r.replay_of is not None
        return r.replay_of

    return positions(read_records(folder / "requests.jsonl"), of)


def two_streams_at_once(chat: Any, model: str, max_tokens: int) -> None:
    """Two streamed requests in flight together (two slots busy at once), read to their ends."""

    def one(prompt: str) -> None:
        for _ in chat.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                             temperature=0, stream=True):
            pass

    both = [threading.Thread(target=one, args=(p,)) for p in ("the first people made a long way",
                                                              "how many words can you write")]
    for t in both:
        t.start()
    for t in both:
        t.join()


def cancel_mid_stream(chat: Any, model: str, recording: Path, tries: int = 5) -> int:
    """The client streams a long answer, reads 4 chunks and goes away. The tiny server can finish a whole answer
    before a client on a loaded machine has read 4 chunks of it (the recording then rightly holds no cancel), so
    again, up to `tries` times, until the recording holds the cancel: returns how many it took."""
    for n in range(1, tries + 1):
        lines = len(read_records(recording)) if recording.is_file() else 0
        stream = chat.create(model=model, messages=[{"role": "user", "content": "the number of the slot"}],
                             max_tokens=900, temperature=0, stream=True)
        for k, _ in enumerate(stream, 1):
            if k == 4:
                stream.close()  # the client stops reading and goes away
                break
        wait_for(lambda n_lines=lines: recording.is_file() and len(read_records(recording)) > n_lines,
                 timeout=60, what="the stream's record")
        if read_records(recording)[-1].cancelled:
            return n
    raise AssertionError(f"the server finished each of {tries} answers before the client went away")


def run_quiet(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=120)
