"""A real llama-server b11434 run captured with the user's `--log-jsonl`, against the same run in text: the capture
keeps the flag and adds nothing that conflicts with it, and the JSON log's tables equal the text log's (docs/jsonl.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models
from tests.capture.capture_helpers import NEEDS_SERVER, manifest, run_kvtrace

pytestmark = NEEDS_SERVER


def _capture(llama_server: Path, tmp: Path, name: str, *extra: str) -> Path:
    pair = ensure_models()
    out = tmp / name
    proc = run_kvtrace(
        "capture", "run", "--ping", "3", "--max-tokens", "48", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
        "--host", "127.0.0.1", "--port", str(free_port()), "-c", "512", "-np", "1", *extra,
        cwd=tmp, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return out


@pytest.fixture(scope="module")
def runs(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("jsonl")
    return _capture(llama_server, tmp, "text"), _capture(llama_server, tmp, "jsonl", "--log-jsonl")


def test_the_users_log_jsonl_is_kept(runs: tuple[Path, Path]) -> None:
    text, jsonl = runs
    m = manifest(jsonl)
    assert "--log-jsonl" in m["effective_command_line"]
    assert m["added_flags"] == manifest(text)["added_flags"]  # --log-timestamps gives each object its time
    raw = (jsonl / "raw.log").read_bytes().split(b"\n")
    objects = [line for line in raw if line.startswith(b'{"type":"log","time":')]
    assert len(objects) > 0.9 * len([line for line in raw if line])  # the server's log is JSON
    assert not any(line.startswith(b'{"type":"log","time":0,') and b'"level":"cont"' not in line
                   for line in objects[:50])  # timestamps on: `time` is set


def _truth(raw: bytes) -> tuple[list[float], list[int], tuple[int, int]]:
    """What the JSON log says itself, read with json alone: each input batch's time and n_tokens (the header
    line after it), and the requests' accepted and generated drafts."""
    objects = [json.loads(line) for line in raw.decode("utf-8", "replace").splitlines() if line.startswith("{")]
    logs = [o for o in objects if o["type"] == "log"]
    times, sizes = [], []
    for i, o in enumerate(logs):
        if o["msg"].endswith("input batch info:\n"):
            times.append(o["time"] / 1e6)
            head = next(x["msg"] for x in logs[i + 1:] if "ubatch_print:   n_tokens " in x["msg"])
            sizes.append(int(head.rsplit("=", 1)[1]))
    drafts = [re.search(r"\(\s*(\d+) accepted /\s*(\d+) generated\)", o["msg"]) for o in logs]
    found = [m for m in drafts if m is not None]
    return times, sizes, (sum(int(m[1]) for m in found), sum(int(m[2]) for m in found))


def test_the_json_log_reads_as_what_it_says(runs: tuple[Path, Path]) -> None:
    """The same setup's text run and JSON run draft differently (sampling), so each is held to its own log: the
    JSON run's tables to what its objects say, read with json alone, and both to what a run of this setup is."""
    text, jsonl = (analyze.parse(str(p)) for p in runs)
    assert (text.meta["log_format"], jsonl.meta["log_format"]) == ("text", "jsonl")
    assert jsonl.meta["log_jsonl"]["objects"] > 1000 and jsonl.meta["log_jsonl"]["text_lines"] < 50
    times, sizes, (accepted, generated) = _truth((runs[1] / "raw.log").read_bytes())
    jb = jsonl.batches
    assert len(jb) == len(times) > 100 and list(jb["n_tokens"]) == sizes
    assert jb["t"].tolist() == pytest.approx(times, abs=1e-6)  # `time` became `t`
    assert jsonl.verdict.acceptance is not None
    assert (jsonl.verdict.acceptance["accepted"], jsonl.verdict.acceptance["generated"]) == (accepted, generated)
    assert generated > 0
    for r in (text, jsonl):  # what the text run reads, the JSON run reads too
        b = r.batches
        assert len(r.kv) > 100 and b["t"].notna().all() and b["t"].is_monotonic_increasing
        assert not b["embd"].fillna(False).astype(bool).any()  # no `embd = (nil)\n"}` read as an embedding
        assert {"target", "drafter"} <= set(b.context.astype(str))
        verify = b[(b.n_tokens > 1) & (b.n_outputs == b.n_tokens)]
        assert len(verify) and (verify.context == "target").all()
        assert (b.n_outputs > 0).all()
        assert len(r.events[r.events.kind == "draft_stats"]) >= 3
    assert jsonl.verdict.kind == text.verdict.kind == "draft_stats_only"
