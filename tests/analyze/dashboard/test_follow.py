"""Following a growing log (the dashboard's --follow): real engine output written piece by piece."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd

from kvtrace import analyze
from kvtrace.analyze.dashboard.follow import Follower

ROOT = Path(__file__).resolve().parents[3]
STALE = (ROOT / "samples" / "stale-drafter" / "raw.log").read_bytes()


def _manifest(folder: Path, **data: object) -> None:
    (folder / "manifest.json").write_text(json.dumps({"host": {"hostname": socket.gethostname()}, **data}))


def test_follows_a_growing_session_and_finishes_like_a_whole_parse(tmp_path: Path) -> None:
    _manifest(tmp_path, kvtrace_pid=os.getpid())
    f = Follower(tmp_path, interval_s=0.0, share=1.0)
    first = f.poll()
    assert first.waiting and first.result is None and not first.ended  # no raw.log yet: no error either
    lines = STALE.splitlines(keepends=True)
    first_error = int(analyze.parse(STALE).errors["line"].iloc[0])
    seen_batches, seen_errors = [], []
    done = 0
    with open(tmp_path / "raw.log", "ab") as out:  # one handle kept open, as a capture does
        for cut in (first_error // 3, first_error, len(lines) * 2 // 3, len(lines)):
            out.write(b"".join(lines[done:cut]))
            out.flush()
            done = cut
            st = f.poll()
            assert st.result is not None and not st.ended and not st.waiting
            seen_batches.append(len(st.result.batches))
            seen_errors.append(st.result.verdict.n_position_errors)
    assert seen_batches == sorted(seen_batches) and seen_batches[1] > 0
    assert seen_errors[0] == 0 and seen_errors[1] >= 1  # the first error shows as soon as its line is written
    assert f.parser.n_bytes == len(STALE)  # every byte went through the parser once
    _manifest(tmp_path, kvtrace_pid=os.getpid(), end="2026-12-01T00:00:00", stop_reason="until-error")
    st = f.poll()
    assert st.ended and st.stop_reason == "until-error"
    whole = analyze.parse(STALE)
    for name in ("batches", "kv", "errors", "events"):
        pd.testing.assert_frame_equal(getattr(st.result, name), getattr(whole, name))
    assert f.poll().version == st.version  # finished: nothing more is read or rebuilt


def test_a_killed_capture_is_told_and_keeps_its_data(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _manifest(tmp_path, kvtrace_pid=dead.pid)
    (tmp_path / "raw.log").write_bytes(STALE[: len(STALE) // 2])
    st = Follower(tmp_path, interval_s=0.0).poll()
    assert st.ended and st.stop_reason == "killed"
    assert st.result is not None and len(st.result.batches) > 0
    assert any("killed" in n for n in st.notices)


def test_a_session_that_never_gets_a_log(tmp_path: Path) -> None:
    _manifest(tmp_path, kvtrace_pid=os.getpid())
    f = Follower(tmp_path, interval_s=0.0)
    assert f.poll().waiting
    _manifest(tmp_path, end="2026-12-01T00:00:00", stop_reason="program exited")
    st = f.poll()
    assert st.ended and st.result is None and "without writing raw.log" in st.notices[-1]


def test_truncated_rotated_and_deleted_files_are_followed(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    half = STALE.rfind(b"\n", 0, len(STALE) // 2) + 1
    log.write_bytes(STALE[:half])
    f = Follower(log, interval_s=0.0, share=1.0)
    a = f.poll()
    assert a.result is not None and not a.ended
    log.write_bytes(b"")  # truncated in place (copytruncate), then written again
    f.poll()
    log.write_bytes(STALE[half:])
    b = f.poll()
    assert any("truncated" in n for n in b.notices)
    assert b.bytes_read == len(STALE)
    log.rename(tmp_path / "server.log.1")  # rotated: a new file at the same name
    log.write_bytes(STALE[:half])
    f.poll()
    c = f.poll()
    assert any("rotated" in n for n in c.notices) and c.bytes_read == len(STALE) + half
    log.unlink()
    d = f.poll()
    assert any("deleted" in n for n in d.notices)
    assert d.result is not None and len(d.result.batches) >= len(a.result.batches)  # what was read stays


def test_a_session_folder_that_appears_after_following_began(tmp_path: Path) -> None:
    """`kvtrace capture engine --out live & kvtrace dashboard live --follow`: the dashboard starts first."""
    from kvtrace.analyze.cli.dashboard import _check_follow

    live = tmp_path / "live"
    _check_follow(live)  # no usage error: the page waits for it
    f = Follower(live, interval_s=0.0, share=1.0)
    assert f.poll().waiting and not f.poll().ended
    live.mkdir()
    _manifest(live, kvtrace_pid=os.getpid())
    st = f.poll()
    assert st.waiting and not st.ended  # the folder, but no raw.log yet
    (live / "raw.log").write_bytes(STALE)
    st = f.poll()
    assert not st.waiting and st.bytes_read == len(STALE) and st.result is not None
    _manifest(live, kvtrace_pid=os.getpid(), end="2026-12-01T00:00:00")
    st = f.poll()
    assert st.ended and len(st.result.batches) == len(analyze.parse(STALE).batches)
