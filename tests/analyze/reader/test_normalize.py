"""Prefixes and paste noise around llama.cpp's own text (docs/llama-cpp-lines.md#line-anatomy and #pastes, corpus prefixes)."""

from __future__ import annotations

import math

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.normalize import clean_chunk, message, parse_prefix

ERROR = "init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:"


@pytest.mark.parametrize(
    ("line", "t", "level"),
    [
        ("3.28.378.761 E " + ERROR, 3 * 60 + 28.378761, "E"),
        ("132.05.318.177 I slot print_timing: id  0 | task 9126 | x", 132 * 60 + 5.318177, "I"),
        ("2026-02-27 15:14:00 [60957] " + ERROR, 1772205240.0, None),
        ("[1707364943] update_slots : failed to find free space in the KV cache", 1707364943.0, None),
        ("llama.cpp-gpu  | update_slots : failed to decode the batch, n_batch = 1, ret = 1", None, None),
        ("Nov 30 09:12:01 gpu-box llama-server[4242]: 0.00.100.000 W dflash: x", 0.1, "W"),
        ("mar 15 11:39:07 acquario3 ollama[87551]: net/http.(*conn).serve(0x1)", 6694747.0, None),  # Italian locale
        ("> `0.01.002.003 E decode: failed to initialize batch`", 1.002003, "E"),
        ("[8080] srv  load_model: loading model", None, None),
        ("[2026-02-27 15:14:00.250] [info] " + ERROR, 1772205240.25, None),
        ("2026-02-27T15:14:00.1234567Z " + ERROR, 1772205240.1234567, None),
        ("glued0.00.001.500 E decode: failed to initialize batch", 0.0015, "E"),
    ],
)
def test_prefixes(line: str, t: float | None, level: str | None) -> None:
    p = parse_prefix(line)
    assert (p.t is None) if t is None else p.t == pytest.approx(t)
    assert p.level == level
    assert not message(line).startswith((" ", ">", "`", "["))


def test_clean_chunk_keeps_line_count() -> None:
    raw = "\x1b[34m0.00.001.000\x1b[0m \x1b[31mE init: x\r\n\x1b[0mnext line\x1b[K\r\n"
    clean = clean_chunk(raw)
    assert clean == "0.00.001.000 E init: x\nnext line\n"
    assert clean.count("\n") == raw.count("\n")


def _pos_block(seq: int, x: int, y: int) -> list[str]:
    return [
        f"init: the tokens of sequence {seq} in the input batch have inconsistent sequence positions:",
        f" - the last position stored in the memory module of the context (i.e. the KV cache) for sequence {seq} is X = {x}",
        f" - the tokens for sequence {seq} in the input batch have a starting position of Y = {y}",
        " for M-RoPE, it is required that the position satisfies: X < Y",
        "decode: failed to initialize batch",
        "llama_decode: failed to decode, ret = -1",
    ]


@pytest.mark.parametrize(
    "wrap",
    [
        lambda ls: ls,
        lambda ls: ["```console", *ls, "```"],
        lambda ls: [f"> {x}" for x in ls],
        lambda ls: [f"`{x}`" for x in ls],
        lambda ls: [x.replace("<", "&lt;") for x in ls],
        lambda ls: [f"\x1b[31m{x}\x1b[0m\r" for x in ls],
        lambda ls: [f"svc-1  | {x}" for x in ls],
        lambda ls: [f"2026-02-27 15:14:00 [60957] {x}   " for x in ls],
    ],
    ids=["raw", "fence", "quote", "backticks", "html", "ansi-crlf", "compose", "router"],
)
def test_paste_noise_does_not_change_the_verdict(wrap) -> None:  # noqa: ANN001
    text = "\n".join(["Some prose first.", *wrap(_pos_block(0, 8791, 192)), "and we are back to it."])
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.last_pos, v.batch_start, v.n_position_errors) == ("inconsistent_positions", 8791, 192, 1)
    errors = analyze.parse(text.encode()).errors
    assert errors.variant.iloc[0] == "mrope_lt"


def test_absolute_times_become_seconds_from_the_first() -> None:
    text = "\n".join([
        "2026-02-27 15:14:00 [60957] slot update_slots: id  3 | task 1 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 10",
        "2026-02-27 15:14:05 [60957] slot      release: id  3 | task 1 | stop processing: n_tokens = 20, truncated = 0",
    ])
    ev = analyze.parse(text.encode()).events
    assert list(ev.t) == [0.0, 5.0]


def test_no_timestamps_means_nan() -> None:
    ev = analyze.parse(b"slot      release: id  0 | task 1 | stop processing: n_tokens = 20, truncated = 0\n").events
    assert math.isnan(ev.t.iloc[0])
