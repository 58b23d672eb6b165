"""A real failing run replayed: upstream DFlash running past the end of a 256-token context (`-c 256
--context-shift`: the drafter cannot find a memory slot for its block, the `kv_slot` failure the scenario matrix
knows), recorded with 20 requests of which one runs past the context. Its replay fails the same way, its replay on
a larger `-c` reads "fixed", and `--shrink` takes it down to at most 2 requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models, ensure_upstream_drafter
from kvtrace.capture.recording import read_records
from tests.capture.capture_helpers import NEEDS_SERVER
from tests.capture.replay_helpers import recorded_capture, replay

pytestmark = NEEDS_SERVER

SHORT = ("the cache and the draft", "write one word for each slot", "the first people made a long way",
         "how many words can you write", "the number of the slot is the pos")
# About 140 tokens: with a 200-token answer it runs past a 256-token context
LONG = " ".join(["the people of the water made a long way up to the first time"] * 10)
TRIGGER = 13  # the one request of the 20 that runs past the context
SIGNATURE = "draft_kv_full"  # the drafter's KV had no room for its block (the reader's verdict: kv_slot)


def server_cmd(server: Path, port: int, ctx: int = 256) -> list[str]:
    pair = ensure_models()
    return [str(server), "-m", str(pair.target), "-md", str(ensure_upstream_drafter("dflash")),
            "--spec-type", "draft-dflash", "--spec-draft-n-max", "3", "-c", str(ctx), "-np", "1", "--context-shift",
            "-t", "1", "-fit", "off", "--host", "127.0.0.1", "--port", str(port)]


@pytest.fixture(scope="module")
def failing(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from openai import OpenAI

    tmp = tmp_path_factory.mktemp("failing")
    port = free_port()
    out = tmp / "before"
    with recorded_capture(out, server_cmd(llama_server, port), port, tmp):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        for i in range(20):
            long = i == TRIGGER
            client.chat.completions.create(model="tiny", temperature=0, max_tokens=200 if long else 8,
                                           messages=[{"role": "user", "content": LONG if long else SHORT[i % 5]}])
    return out


def test_the_recorded_run_fails_as_kv_slot(failing: Path) -> None:
    result = analyze.parse(failing / "raw.log")
    assert len(result.errors) and result.verdict.kind == "kv_slot" and match_signature(result).name == SIGNATURE
    chats = [r for r in read_records(failing / "requests.jsonl") if r.path == "/v1/chat/completions"]
    assert len(chats) == 20 and all(r.status == 200 for r in chats)


def test_its_replay_fails_the_same_way(failing: Path, llama_server: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    code, verdict, err = replay(str(failing), "--json", "--quiet", "--as-fast", "--out", str(out), "--",
                                *server_cmd(llama_server, free_port()), cwd=tmp_path)
    assert verdict is not None and verdict["verdict"] == "still_failing" and code == 1, err[-3000:]
    assert match_signature(analyze.parse(out / "raw.log")).name == SIGNATURE


def test_its_replay_on_a_larger_context_reads_fixed(failing: Path, llama_server: Path, tmp_path: Path) -> None:
    out = tmp_path / "fix"
    code, verdict, err = replay(str(failing), "--json", "--quiet", "--as-fast", "--out", str(out), "--",
                                *server_cmd(llama_server, free_port(), ctx=2048), cwd=tmp_path)
    assert code == 0 and verdict is not None, err[-3000:]
    assert verdict["verdict"] == "fixed" and verdict["requests"]["answered"] == verdict["requests"]["recorded"]


def test_shrink_takes_twenty_requests_to_at_most_two(failing: Path, llama_server: Path, tmp_path: Path) -> None:
    out = tmp_path / "repro"
    code, summary, err = replay(str(failing), "--shrink", "--as-fast", "--json", "--quiet", "--max-runs", "24",
                                "--out", str(out), "--", *server_cmd(llama_server, free_port()), cwd=tmp_path,
                                timeout=900)
    assert code == 0 and summary is not None, err[-3000:]
    repro = read_records(out / "repro.jsonl")
    assert len(repro) <= 2 and summary["requests"]["left"] == len(repro)
    assert any(r.body and LONG in json.dumps(r.body) for r in repro)  # the trigger is what is left
    assert summary["signature"] == SIGNATURE and summary["runs"] <= 24
    assert match_signature(analyze.parse(out / "raw.log")).name == SIGNATURE  # the smallest run still fails
