"""Every kind of source, and every kind of bad input: a result or one clear line, never a traceback."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.source import MAX_LINE

ROOT = Path(__file__).resolve().parents[3]
SEED = Path(__file__).parents[2] / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"


def test_path_bytes_fileobj_gzip_and_session_folder_agree(tmp_path: Path) -> None:
    data = SEED.read_bytes()
    gz = tmp_path / "renamed.txt"  # compressed but not named .gz: the bytes decide
    gz.write_bytes(gzip.compress(data))
    session = tmp_path / "session"
    session.mkdir()
    (session / "raw.log").write_bytes(data)
    results = [analyze.parse(SEED), analyze.parse(data), analyze.parse(io.BytesIO(data)), analyze.parse(gz),
               analyze.parse(session)]
    for r in results:
        assert (r.verdict.kind, r.verdict.last_pos, r.verdict.batch_start) == ("inconsistent_positions", 259, 1361)
        assert r.lines == results[0].lines


def test_stdin() -> None:
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--json", "-"], input=SEED.read_bytes(),
                         capture_output=True, check=True)
    assert b'"last_pos": 259' in out.stdout


def test_truncated_gzip_keeps_what_was_there() -> None:
    data = gzip.compress(SEED.read_bytes() * 50)
    r = analyze.parse(data[: len(data) // 2])
    assert r.warnings and "ends early" in r.warnings[0]
    assert r.verdict.kind == "inconsistent_positions"


def test_overlong_line_is_cut_and_counted_once() -> None:
    data = b"x" * (3 * MAX_LINE) + b"\n" + SEED.read_bytes()
    r = analyze.parse(data)
    assert r.lines == analyze.parse(SEED).lines + 1
    assert r.verdict.last_pos == 259


@pytest.mark.parametrize("data", [b"", b"\x00" * 1000, bytes(range(256)) * 40, b"\xff\xfe\x00garbage", b"\n\n\n"])
def test_junk_gives_no_log(data: bytes) -> None:
    r = analyze.parse(data)
    assert r.verdict.kind == "no_log"
    assert r.batches.empty and r.errors.empty


def test_a_session_manifest_adds_the_flags_its_log_never_prints(tmp_path: Path) -> None:
    """The command line is in the manifest, not in raw.log: read from the folder or its raw.log, not from a
    log elsewhere, and never where the manifest is not a JSON object."""
    import json

    from kvtrace.analyze.reader.session import KEY_COMMAND_LINE, log_of, manifest_of

    session = tmp_path / "session"
    session.mkdir()
    log_of(session).write_bytes(SEED.read_bytes())
    manifest_of(session).write_text(json.dumps({KEY_COMMAND_LINE: "llama-server -m t.gguf -sm row -ts 3,1"}))
    for source in (session, log_of(session)):
        flags = analyze.parse(source).meta["flags"]
        assert (flags.get("-sm"), flags.get("-ts")) == ("row", "3,1"), source
    elsewhere = tmp_path / "copy.log"
    elsewhere.write_bytes(SEED.read_bytes())
    assert "-sm" not in analyze.parse(elsewhere).meta["flags"]
    manifest_of(session).write_text(json.dumps(["-sm", "row"]))
    assert "-sm" not in analyze.parse(session).meta["flags"]


def test_missing_file_and_folder_without_log(tmp_path: Path) -> None:
    with pytest.raises(analyze.InputError, match="no such file"):
        analyze.parse(tmp_path / "nope.log")
    with pytest.raises(analyze.InputError, match="without raw.log"):
        analyze.parse(tmp_path)


def test_stream_parser_matches_whole_parse() -> None:
    data = SEED.read_bytes()
    sp = analyze.StreamParser("seed")
    for i in range(0, len(data), 97):  # odd chunk sizes split lines anywhere
        sp.feed(data[i : i + 97])
    assert sp.stats().position_errors == 3
    r = sp.finish()
    whole = analyze.parse(data)
    assert r.verdict.to_dict() | {"source": ""} == whole.verdict.to_dict() | {"source": ""}
    assert r.lines == whole.lines


def test_stream_parser_snapshot_is_not_destructive() -> None:
    """A live view asks for the tables while the log grows: asking changes nothing that follows."""
    data = (ROOT / "samples" / "stale-drafter" / "raw.log").read_bytes()
    whole = analyze.parse(data)
    first_error = int(whole.errors["line"].iloc[0])
    lines = data.splitlines(keepends=True)
    sp = analyze.StreamParser("live")
    sp.feed(b"".join(lines[:first_error]))  # up to and including the error's first line: still open
    early = sp.snapshot()
    assert len(early.errors) == 1 and early.verdict.kind == "inconsistent_positions"
    assert early.verdict.n_position_errors == 1
    again = sp.snapshot()
    assert again.verdict.to_dict() == early.verdict.to_dict() and len(again.batches) == len(early.batches)
    rest = b"".join(lines[first_error:])
    for i in range(0, len(rest), 4099):
        sp.feed(rest[i : i + 4099])
        if i % (4099 * 50) == 0:
            sp.snapshot()
    r = sp.finish()
    assert r.verdict.to_dict() | {"source": ""} == whole.verdict.to_dict() | {"source": ""}
    for name in ("batches", "kv", "errors", "events"):
        pd.testing.assert_frame_equal(getattr(r, name), getattr(whole, name))


def test_a_fork_dflash_log_names_its_speculative_type() -> None:
    """beellama prints no implementation line in some versions; its DFlash contract line and the
    drafter-context cap it sets for --spec-type dflash (fork arg.cpp) name the type."""
    contract = ("1.16.873.701 I dflash: contract ok: block_size=16 mask_token=248070 target_layer_ids=[1,16,31,46,61] "
                "n_target_layers=5 n_embd=5120 n_target_features=25600 target_layers=64 cross_ctx=1024\n")
    cap = "0.00.035.194 I dflash: setting -cd to 256 (drafter doesn't need the full main ctx; pass -cd N to override)\n"
    for text in (contract, cap):
        r = analyze.parse(text.encode())
        assert (r.meta["spec_type"], r.meta["drafter_kv"]) == ("dflash", "mirror")
        assert r.events.empty  # the contract's key=value body is not taken as a DFlash debug event
    assert analyze.parse(ROOT / "samples" / "healthy").meta["spec_type"] == "dflash"  # the engine's fork flavour
