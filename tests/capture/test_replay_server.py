"""`capture run --record` and `kvtrace replay` on a real llama-server (b11434, `make server`) with the tiny models,
the official `openai` client as the user's client: streamed and plain chat, a multi-turn conversation, tool calls
(`--jinja` and a `tools` request), two slots at once, a cancel mid-stream. One recorded session for the module."""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models
from kvtrace.capture.recording import read_records
from tests.capture.capture_helpers import NEEDS_SERVER, run_kvtrace, start_kvtrace, wait_for
from tests.capture.replay_helpers import (
    cancel_mid_stream,
    recorded_capture,
    recorded_positions,
    replay,
    replayed_positions,
    two_streams_at_once,
)

pytestmark = NEEDS_SERVER

SYSTEM = "you write one word for each slot"
TOOLS = [{"type": "function", "function": {
    "name": "get_water_level", "description": "the water level of a lake, in cm",
    "parameters": {"type": "object", "properties": {"lake": {"type": "string", "description": "the lake's name"}},
                   "required": ["lake"]}}}]


def server_cmd(server: Path, port: int) -> list[str]:
    pair = ensure_models()
    return [str(server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
            "--spec-draft-n-max", "3", "-c", "2048", "-np", "2", "--jinja", "-t", "1", "-fit", "off",
            "--host", "127.0.0.1", "--port", str(port)]


def drive(port: int, recording: Path) -> dict[str, Any]:
    """The user's client: every kind of request the issue names, at temperature 0."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-user-secret", max_retries=0, timeout=120)
    chat = client.chat.completions
    seen: dict[str, Any] = {}
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the cache and the draft"}]
    plain = chat.create(model="tiny", messages=first, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    seen["plain"] = plain.choices[0].message.content
    streamed = chat.create(model="tiny", messages=first, max_tokens=16, temperature=0,  # type: ignore[arg-type]
                           stream=True)
    seen["streamed"] = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    turns = [*first, {"role": "assistant", "content": seen["plain"]},
             {"role": "user", "content": "write one more word about the water"}]
    chat.create(model="tiny", messages=turns, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_water_level", "arguments": json.dumps({"lake": "the long water"})}}
    with_tools = [*first, {"role": "user", "content": "how high is the long water"},
                  {"role": "assistant", "content": "", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "the water is 40 cm up"}]
    chat.create(model="tiny", messages=with_tools, tools=TOOLS, max_tokens=16, temperature=0)  # type: ignore[arg-type]

    two_streams_at_once(chat, "tiny", 48)
    cancel_mid_stream(chat, "tiny", recording)  # the client goes away mid-stream
    # an answered request after the cancel: it waits in the replay for the cancel to have happened
    chat.create(model="tiny", messages=first, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    return seen


@pytest.fixture(scope="module")
def recorded(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("record")
    port = free_port()
    out = tmp / "before"
    with recorded_capture(out, server_cmd(llama_server, port), port, tmp):
        seen = drive(port, out / "requests.jsonl")
    assert seen["plain"] == seen["streamed"]  # the proxy changed nothing the client reads
    return out


def test_every_request_the_client_sent_is_recorded(recorded: Path) -> None:
    text = (recorded / "requests.jsonl").read_text()
    assert "sk-user-secret" not in text and "authorization" not in text.lower()
    records = [r for r in read_records(recorded / "requests.jsonl") if r.path.startswith("/v1/")]
    assert [r.path for r in records] == ["/v1/chat/completions"] * len(records) and len(records) >= 8
    assert [r.stream for r in records[:7]] == [False, True, False, False, True, True, True] and not records[-1].stream
    assert all(r.status == 200 for r in records)
    assert len(records[2].body["messages"]) == 4  # the second turn sends the first back
    assert records[3].body["tools"][0]["function"]["name"] == "get_water_level"
    assert records[3].body["messages"][3]["tool_calls"][0]["function"]["name"] == "get_water_level"
    assert max(records[4].in_flight, records[5].in_flight) == 2  # two slots at once
    cancelled = [r for r in records if r.cancelled]
    # the proxy passed on at least what the client read before it went away (and what the fast tiny server sent
    # meanwhile), not the whole answer: the server stopped on the cancel before its 900 tokens and their timings;
    # and how long after the last of those events the client went away
    assert len(cancelled) == 1 and 4 <= cancelled[0].events < 900 and cancelled[0].timings is None
    assert cancelled[0].cancel_gap is not None and 0 <= cancelled[0].cancel_gap < 5
    for r in records:
        assert r.start <= (r.first_token or r.start) <= (r.end or 0)
        if not r.cancelled:
            assert r.timings is not None and r.timings["predicted_n"] > 0 and r.answer.sha256
    m = json.loads((recorded / "manifest.json").read_text())
    assert m["record"]["requests"] >= 8 and m["record"]["cancelled"] == 1


def test_the_replay_sends_the_same_requests_and_reads_unchanged(recorded: Path, llama_server: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "after"
    code, verdict, err = replay(str(recorded), "--json", "--quiet", "--out", str(out), "--",
                                *server_cmd(llama_server, free_port()), cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert verdict == {"verdict": "unchanged", "session": str(out),
                       "requests": {"recorded": verdict["requests"]["recorded"],
                                    "answered": verdict["requests"]["recorded"]}}
    assert verdict["requests"]["recorded"] >= 8
    sent = read_records(out / "requests.jsonl")
    sent_again = [r for r in read_records(recorded / "requests.jsonl") if r.reached_server]
    assert sorted(r.replay_of for r in sent) == sorted(r.id for r in sent_again)  # type: ignore[type-var]
    by_id = {r.id: r for r in sent_again}
    for r in sent:  # as they were: method, path, body, streaming
        was = by_id[r.replay_of]  # type: ignore[index]
        assert (r.method, r.path, r.body, r.stream) == (was.method, was.path, was.body, was.stream)
    before, after = recorded_positions(recorded), replayed_positions(out)
    assert before and after == before  # at temperature 0: the same target positions per request
    replayed = {r.replay_of: r for r in sent}
    cancelled = [r for r in read_records(recorded / "requests.jsonl") if r.cancelled]
    cut = replayed[cancelled[0].id]  # at the same place in the chunk stream
    assert cut.cancelled and cut.events == cancelled[0].events
    assert cut.cancel_gap is not None and cut.cancel_gap >= (cancelled[0].cancel_gap or 0.0)
    assert analyze.parse(out / "raw.log").verdict.kind == analyze.parse(recorded / "raw.log").verdict.kind


def test_the_shape_replays_to_the_same_positions_without_the_words(recorded: Path, llama_server: Path,
                                                                   tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    proc = run_kvtrace("redact", str(recorded), "--model", str(ensure_models().target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    shape = recorded / "requests.shape.jsonl"
    text = shape.read_text()
    for words in ("the cache and the draft", "get_water_level", "the long water", SYSTEM):
        assert words not in text
    for name in ("requests.shape.jsonl", "shareable.log"):
        (shared / name).write_bytes((recorded / name).read_bytes())
    shaped = [r for r in read_records(shape) if r.path == "/v1/chat/completions"]
    assert shaped[2].shape is not None and shaped[2].shape["links"]  # the second turn sends an answer back
    out = tmp_path / "maintainer"
    code, verdict, err = replay(str(shared / "requests.shape.jsonl"), "--json", "--quiet", "--out", str(out), "--",
                                *server_cmd(llama_server, free_port()), cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert verdict is not None and verdict["verdict"] == "unchanged"
    assert replayed_positions(out) == recorded_positions(recorded)


def test_a_truncated_recording_is_one_line_and_exit_2(recorded: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "raw.log").write_bytes((recorded / "raw.log").read_bytes())
    data = (recorded / "requests.jsonl").read_bytes()
    (cut / "requests.jsonl").write_bytes(data[: len(data) - 40])
    proc = run_kvtrace("replay", str(cut), "--", "llama-server", cwd=tmp_path)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "cut" in err[0] and "Traceback" not in err[0], err
    edited = data.decode().splitlines(keepends=True)
    edited[1] = re.sub(r'"method":"[A-Z]+"', '"method":7', edited[1])
    (cut / "requests.jsonl").write_text("".join(edited))
    proc = run_kvtrace("replay", str(cut), "--", "llama-server", cwd=tmp_path)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "line 2" in err[0] and "method" in err[0], err


def test_a_port_in_use_is_one_line_and_exit_2(llama_server: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_kvtrace("capture", "run", "--record", "--quiet", "--out", str(tmp_path / "s"), "--",
                           *server_cmd(llama_server, port), cwd=tmp_path)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"port {port}" in err[0], err
    assert not (tmp_path / "s").exists()  # nothing was started


def test_a_server_that_never_answers_is_one_line_and_exit_2(recorded: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    proc = run_kvtrace("replay", str(recorded), "--server", f"http://127.0.0.1:{free_port()}", "--log", str(log),
                       "--health-timeout", "2", "--quiet", "--out", str(tmp_path / "r"), cwd=tmp_path)
    err = [line for line in proc.stderr.decode().strip().splitlines() if "error" in line]
    assert proc.returncode == 2 and len(err) == 1 and "never answered" in err[0], proc.stderr.decode()


def test_a_session_without_a_recording_is_one_line_and_exit_2(recorded: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "raw.log").write_bytes((recorded / "raw.log").read_bytes())
    proc = run_kvtrace("replay", str(bare), "--", "llama-server", cwd=tmp_path)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "requests.jsonl" in err[0], err


def test_a_replay_stopped_half_way_leaves_a_session_that_parses(recorded: Path, llama_server: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "cut"
    proc = start_kvtrace("replay", str(recorded), "--quiet", "--out", str(out), "--",
                         *server_cmd(llama_server, free_port()), cwd=tmp_path)
    sent = out / "requests.jsonl"
    wait_for(lambda: sent.is_file() and sent.read_text().count('"/v1/chat') >= 1, timeout=240,
             what="a chat request replayed")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM  # stopped by the user: no verdict, the capture's code
    done = read_records(sent)  # whole lines only: every request sent so far
    # a loaded machine may finish the replay before the signal lands: the session must parse either way
    assert sum(r.path == "/v1/chat/completions" for r in done) >= 1
    assert analyze.parse(out).lines > 0
    assert json.loads((out / "manifest.json").read_text())["replay"]["sent"] == len(done)


def test_redact_on_a_recorded_capture_writes_the_shape_too(llama_server: Path, tmp_path: Path) -> None:
    from tests.capture.replay_helpers import healthy

    port = free_port()
    out = tmp_path / "s"
    proc = start_kvtrace("capture", "run", "--record", "--redact", "--quiet", "--out", str(out), "--",
                         *server_cmd(llama_server, port), cwd=tmp_path)
    wait_for(lambda: healthy(port) or proc.poll() is not None, timeout=240, what="the recorded server")
    from openai import OpenAI

    OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the cache and the draft"}], max_tokens=8, temperature=0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert (out / "shareable.log").is_file(), err.decode()[-2000:]
    shaped = [r for r in read_records(out / "requests.shape.jsonl") if r.path == "/v1/chat/completions"]
    assert len(shaped) == 1 and "the cache and the draft" not in (out / "requests.shape.jsonl").read_text()
    assert shaped[0].shape == {"links": [], "answer_tokens": 8}
