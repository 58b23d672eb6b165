"""`kvtrace capture run --redact` on a real llama-server (b11434, `make server`) with private prompts: the
shareable copy holds no word of the prompts or of the answers, and triages exactly like raw.log."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.session import SHAREABLE, free_port
from kvtrace.capture.models import ensure_models
from tests.analyze.reader.test_redact import TEXT_PIECE, assert_triages_alike
from tests.capture.capture_helpers import NEEDS_SERVER, end_lines, manifest, run_kvtrace, start_kvtrace

pytestmark = NEEDS_SERVER

# Words no llama.cpp message and no word of the tiny models' vocabulary holds: any of them in the copy is a leak
SYSTEM = "Snorkelvane preamble"
PROMPTS = ("Zorblaxian quokkafied\nmarmalisation", "glimmerwhisk plonkety", "Fizzlewomp", "Quaxelbrot jinglewort")
FORCED = "frobnicatrix wibbleton"  # the answer a grammar forces (the tiny models' own answers are common words)
PRIVATE = re.compile(rb"snorkel|zorbl|quokk|marmalis|glimmerw|plonket|fizzlew|quaxel|jinglew|frobnic|wibblet", re.I)


def _wait_healthy(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("llama-server did not become healthy")


@pytest.fixture(scope="module")
def redacted_session(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], str]:
    """A capture with LLAMA_BATCH_DEBUG=2 (token text in the dumps), driven by the openai client: a chat with a
    system prompt, a streamed chat, a grammar-forced answer, and /completion with token probabilities."""
    pair = ensure_models()
    tmp = tmp_path_factory.mktemp("redact")
    out, port = tmp / "session", free_port()
    proc = start_kvtrace(
        "capture", "run", "--redact", "--batch-debug", "2", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
        "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-np", "1", cwd=tmp,
    )
    answers: list[str] = []
    try:
        _wait_healthy(port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60)
        r = client.chat.completions.create(model="m", max_tokens=16, temperature=0, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[0]}])
        answers.append(r.choices[0].message.content or "")
        stream = client.chat.completions.create(model="m", max_tokens=16, temperature=0, stream=True,
                                                messages=[{"role": "user", "content": PROMPTS[1]}])
        answers.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        r = client.chat.completions.create(model="m", max_tokens=32, temperature=0,
                                           messages=[{"role": "user", "content": PROMPTS[2]}],
                                           extra_body={"grammar": f'root ::= "{FORCED}"'})
        answers.append(r.choices[0].message.content or "")
        r2 = httpx.post(f"http://127.0.0.1:{port}/completion", timeout=60,
                        json={"prompt": PROMPTS[3], "n_predict": 8, "n_probs": 2, "stream": True})
        answers.append("".join(json.loads(line[5:]).get("content", "") for line in r2.text.splitlines()
                               if line.startswith("data: {")))
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr.decode()[-3000:]
    return out, answers, stderr.decode()


def test_the_capture_writes_the_shareable_copy_and_the_manifest_says_so(
        redacted_session: tuple[Path, list[str], str]) -> None:
    out, _, stderr = redacted_session
    m = manifest(out)
    assert m["redacted"]["log"] == SHAREABLE and m["redacted"]["from"] == "raw.log"
    assert m["redacted"]["changed_lines"] > 0 and m["redacted"]["lines"] == len((out / "raw.log").read_bytes()
                                                                              .split(b"\n")) - 1
    assert m["redacted"]["removed"]["batch_token"]["lines"] > 0
    assert m["env_set"]["LLAMA_BATCH_DEBUG"] == "2"
    shareable = out / SHAREABLE
    assert end_lines(stderr.encode(), "kvtrace: redacted:") == [
        f"kvtrace: redacted: {m['redacted']['changed_lines']:,} of {m['redacted']['lines']:,} lines in {shareable} "
        "(prompts and answers removed; raw.log still holds them)",
        f"kvtrace: attach {SHAREABLE} and manifest.json from {out} to a bug report; next: kvtrace triage {shareable}",
    ]


def test_no_word_of_the_prompts_or_answers_is_left(redacted_session: tuple[Path, list[str], str]) -> None:
    out, answers, _ = redacted_session
    raw, shared = (out / "raw.log").read_bytes(), (out / SHAREABLE).read_bytes()
    assert answers[2] == FORCED
    # the private words were there: in the slot's prompt, the JSON, the grammar, Parsed message
    found = {w.lower() for w in PRIVATE.findall(raw)}
    assert found == {w.lower() for w in PRIVATE.findall(" ".join([SYSTEM, *PROMPTS, FORCED]).encode())}
    assert PRIVATE.findall(shared) == []
    for answer in answers:
        if len(answer.strip()) >= 6:
            assert answer.encode() not in shared
    # what carries the tiny models' answers (common words that llama.cpp's own messages use too) holds no text:
    assert b"ubatch_print" in shared and b"draft candidate" in shared and b"next token:" in shared
    assert not TEXT_PIECE.search(shared)  # batch-dump token rows (LLAMA_BATCH_DEBUG=2), special tokens apart
    assert not re.search(rb"(?:draft candidate|next token:)[^\n']*'(?!\[redacted\]'$)", shared, re.M)
    assert not re.search(rb'"(?:content|prompt|text|token|generated)":"(?!\[redacted\]"|")', shared)
    assert re.search(rb'"content":"[^"]', raw)


def test_the_shareable_copy_triages_exactly_like_raw_log(redacted_session: tuple[Path, list[str], str]) -> None:
    out, _, _ = redacted_session
    original, redacted = analyze.parse(out / "raw.log"), analyze.parse(out / SHAREABLE)
    assert original.verdict.kind == "draft_stats_only" and len(original.batches) > 50
    assert_triages_alike(original, redacted)  # kind, batches, kv, errors, events, X/Y, acceptance
    assert redacted.meta["flags"] == original.meta["flags"] and original.meta["flags"]  # both read the manifest
    triage = [run_kvtrace("triage", str(p), cwd=out).stdout.decode().splitlines()[1:] for p in
              (out / "raw.log", out / SHAREABLE)]
    assert triage[0] == triage[1] and triage[0]


def test_ping_with_redact_keeps_the_prompt_out_of_the_manifest(llama_server: Path, tmp_path: Path) -> None:
    pair = ensure_models()
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture", "run", "--ping", "1", "--max-tokens", "8", "--prompt", PROMPTS[0], "--redact", "--quiet",
        "--json", "--out", str(out), "--", str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter),
        "--spec-type", "draft-simple", "--host", "127.0.0.1", "--port", str(free_port()), "-c", "256", "-np", "1",
        cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["redacted"]["log"] == SHAREABLE and summary["redacted"] == manifest(out)["redacted"]
    assert manifest(out)["ping_config"]["prompt"] == "[redacted]"
    assert manifest(out)["redacted"]["manifest"] == ["ping_config.prompt"]
    assert PRIVATE.findall((out / "manifest.json").read_bytes()) == []
    assert PRIVATE.findall((out / SHAREABLE).read_bytes()) == []
