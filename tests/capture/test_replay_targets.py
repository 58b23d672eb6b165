"""The other two places a recording comes from and goes to, on a real llama-server (b11434, `make server`) with the
tiny models and the official `openai` client as the user's client: `capture llama-swap CONFIG MODEL --record`
(kvtrace runs the config's cmd itself and listens on what `${PORT}` stands for), `replay --llama-swap CONFIG
MODEL`, and `replay --server URL --log FILE` on a server that is already running (the test starts it, as a user
would, with its log going to a file). The recording holds a cancel mid-stream: each replay cuts it at the same
place in the chunk stream."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models
from kvtrace.capture.recording import RecordedRequest, read_records
from tests.capture.capture_helpers import NEEDS_SERVER, manifest, wait_for
from tests.capture.replay_helpers import (
    cancel_mid_stream,
    healthy,
    recorded_capture,
    recorded_positions,
    replay,
    replayed_positions,
    two_streams_at_once,
)

pytestmark = NEEDS_SERVER

MODEL = "tiny-draft"


def server_args(server: Path, port: str) -> list[str]:
    pair = ensure_models()
    return [str(server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
            "--spec-draft-n-max", "3", "-c", "2048", "-np", "2", "-t", "1", "-fit", "off",
            "--host", "127.0.0.1", "--port", port]


@pytest.fixture(scope="module")
def config(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama-swap config as a user has one: the model's cmd over several lines, `${PORT}` where it listens."""
    path = tmp_path_factory.mktemp("swap") / "config.yaml"
    cmd = "\n      ".join(server_args(llama_server, "${PORT}"))
    path.write_text(f"healthCheckTimeout: 120\nmodels:\n  {MODEL}:\n    cmd: |\n      {cmd}\n"
                    f"    checkEndpoint: /health\n", encoding="utf-8")
    return path


def drive(port: int, recording: Path) -> None:
    """The user's client through what it takes for the model's port: plain, streamed, a second turn, two at once,
    and a stream it stops reading after 4 chunks."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-user-secret", max_retries=0, timeout=120)
    chat = client.chat.completions
    first = [{"role": "user", "content": "the cache and the draft"}]
    plain = chat.create(model=MODEL, messages=first, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    streamed = chat.create(model=MODEL, messages=first, max_tokens=16, temperature=0,  # type: ignore[arg-type]
                           stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain.choices[0].message.content
    turns = [*first, {"role": "assistant", "content": plain.choices[0].message.content},
             {"role": "user", "content": "write one more word about the water"}]
    chat.create(model=MODEL, messages=turns, max_tokens=16, temperature=0)  # type: ignore[arg-type]

    two_streams_at_once(chat, MODEL, 32)
    cancel_mid_stream(chat, MODEL, recording)
    chat.create(model=MODEL, messages=first, max_tokens=8, temperature=0)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def recorded(config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("swap-record")
    port = free_port()  # what ${PORT} stands for: kvtrace listens there, the model's server moves behind it
    out = tmp / "before"
    with recorded_capture(out, [], port, tmp, kvtrace=("capture", "llama-swap", str(config), MODEL, "--record",
                                                       "--port", str(port))):
        drive(port, out / "requests.jsonl")
    return out


def chats(folder: Path) -> list[RecordedRequest]:
    return [r for r in read_records(folder / "requests.jsonl") if r.path == "/v1/chat/completions"]


def the_cancel(records: list[RecordedRequest]) -> RecordedRequest:
    cancelled = [r for r in records if r.cancelled]
    assert len(cancelled) == 1, [(r.id, r.events) for r in records]
    return cancelled[0]


def test_llama_swap_records_what_the_client_sent_through_its_port(recorded: Path) -> None:
    m = manifest(recorded)
    assert m["kind"] == "llama-swap" and m["llama_swap"]["model_id"] == MODEL
    listen, server = m["record"]["listen"], m["record"]["server"]
    assert listen == f"http://127.0.0.1:{m['llama_swap']['port']}" and server != listen  # the server moved
    records = chats(recorded)
    assert [r.stream for r in records[:6]] == [False, True, False, True, True, True] and not records[-1].stream
    assert all(r.status == 200 and r.body["model"] == MODEL for r in records)
    assert max(records[3].in_flight, records[4].in_flight) == 2
    assert "sk-user-secret" not in (recorded / "requests.jsonl").read_text()
    cancel = the_cancel(records)
    # where the client went away in the chunk stream: after the events passed on to it (at least the 4 it read)
    # and this long after the last of them; never after the whole answer (no timings: the server stopped)
    assert 4 <= cancel.events < 900 and cancel.timings is None
    assert cancel.cancel_gap is not None and 0 <= cancel.cancel_gap < 5


def check_replay(recorded: Path, out: Path, verdict: dict[str, object] | None) -> None:
    assert verdict is not None and verdict["verdict"] == "unchanged" and verdict["session"] == str(out)
    sent = sum(r.reached_server for r in read_records(recorded / "requests.jsonl"))
    assert verdict["requests"] == {"recorded": sent, "answered": sent}
    before, after = recorded_positions(recorded), replayed_positions(out)
    assert len(before) >= 6 and after == before  # at temperature 0: the same target positions per request
    was, now = the_cancel(chats(recorded)), the_cancel(chats(out))
    # cut at the same place: as many events, as long after the last of them, as the client went away then
    assert now.replay_of == was.id and now.events == was.events
    assert was.cancel_gap is not None and now.cancel_gap is not None and now.cancel_gap >= was.cancel_gap


def test_replay_on_the_llama_swap_config_reads_unchanged(recorded: Path, config: Path, tmp_path: Path) -> None:
    out = tmp_path / "after"
    code, verdict, err = replay(str(recorded), "--llama-swap", str(config), MODEL, "--json", "--quiet", "--out",
                                str(out), cwd=tmp_path)
    assert code == 0, err[-3000:]
    check_replay(recorded, out, verdict)
    m = manifest(out)
    assert m["llama_swap"]["model_id"] == MODEL and m["replay"]["sent"] == verdict["requests"]["recorded"]


@pytest.fixture
def running_server(llama_server: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A llama-server the user started themselves, its log going to a file."""
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(server_args(llama_server, str(port)), stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: healthy(port) or proc.poll() is not None, timeout=240, what="the running server")
        assert proc.poll() is None, log.read_text()[-2000:]
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(60)


def test_replay_on_a_running_server_reads_unchanged(recorded: Path, running_server: tuple[str, Path],
                                                    tmp_path: Path) -> None:
    url, log = running_server
    out = tmp_path / "after"
    code, verdict, err = replay(str(recorded), "--server", url, "--log", str(log), "--json", "--quiet", "--out",
                                str(out), cwd=tmp_path)
    assert code == 0, err[-3000:]
    check_replay(recorded, out, verdict)
    assert json.loads((out / "manifest.json").read_text())["replay"]["url"] == url
