"""The engine's `--log-format jsonl` against its text log: the same run (same settings and seed: the engine is
deterministic, and the two ground truths are held equal to show it) written both ways must read the same, so a
failure in llama.cpp's JSON log has ground truth (docs/jsonl.md)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.session import KEY_COMMAND_LINE, new_session
from kvtrace.capture.engine import EngineConfig, run_engine
from kvtrace.capture.models import ensure_models, ensure_shared_drafter, ensure_upstream_drafter

from .capture_helpers import run_kvtrace

pytestmark = pytest.mark.engine

LEVELS = {"none", "debug", "info", "warn", "error", "cont"}
PREFIX = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ")
XY = re.compile(r"for sequence (\d+) is X = (-?\d+)\n - the tokens for sequence \1 in the input batch have a "
                r"starting position of Y = (-?\d+)\n")
# (spec type, drafting, fault): each run twice, text and jsonl
CASES = [
    ("draft-dflash", "block", "stale-drafter"),
    ("draft-simple", "block", "stale-drafter"),
    ("draft-eagle3", "block", "stale-drafter"),
    ("draft-dflash", "block", "none"),
    ("draft-simple", "chain", "none"),
]
IDS = [f"{s.removeprefix('draft-')}-{d}-{f}" for s, d, f in CASES]
STALE = [c for c in CASES if c[2] == "stale-drafter"]
HEALTHY = [c for c in CASES if c[2] == "none"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jsonl-models")
    ensure_models(path, seed=0)
    ensure_shared_drafter(path, seed=0)
    ensure_upstream_drafter("dflash", path, seed=0)
    ensure_upstream_drafter("eagle3", path, seed=0)
    return path


@pytest.fixture(scope="module")
def runs(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], tuple[Path, Path]]:
    out = {}
    for case, name in zip(CASES, IDS, strict=True):
        spec, drafting, fault = case
        paths = []
        for fmt in ("text", "jsonl"):
            cfg = EngineConfig(spec_type=spec, drafting=drafting, fault=fault, requests=3, cycles=24, seed=1,
                               cache_dir=cache, log_format=fmt)
            session = new_session("engine", out=tmp_path_factory.mktemp(f"{name}-{fmt}"))
            run_engine(cfg, session)
            paths.append(session.path)
        out[case] = (paths[0], paths[1])
    return out


def _objects(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "raw.log").read_bytes().splitlines()]


def _manifest(session: Path) -> dict[str, Any]:
    return dict(json.loads((session / "manifest.json").read_text()))


def _same(a: pd.DataFrame, b: pd.DataFrame, drop: tuple[str, ...] = ("line", "t")) -> None:
    """Two tables equal but for their lines and times (the JSON file has other line numbers and its own clock)."""
    cols = [c for c in a.columns if c not in drop]
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))


def _texts(lines: str) -> list[str]:
    """An error's lines (the `lines` column) without the text log's prefixes."""
    return [PREFIX.sub("", t) for _, t in json.loads(lines)]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_run_in_both_formats(runs: dict, case: tuple) -> None:
    """The two captures are the same run: the same decodes with the same positions and outcomes."""
    text, jsonl = runs[case]
    gt_text, gt_json = (pd.read_parquet(p / "ground_truth.parquet") for p in (text, jsonl))
    _same(gt_text, gt_json, drop=("line",))
    assert len(gt_json) > 100
    m_text, m_json = _manifest(text), _manifest(jsonl)
    assert m_json["engine"]["log_format"] == "jsonl" and m_text["engine"]["log_format"] == "text"
    assert "--log-format jsonl" in m_json[KEY_COMMAND_LINE] and "--log-format" not in m_text[KEY_COMMAND_LINE]
    assert m_json["outcome"]["log_levels"] == m_text["outcome"]["log_levels"]  # the same calls, written both ways


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_jsonl_file_parses_line_by_line(runs: dict, case: tuple) -> None:
    text, jsonl = runs[case]
    objects = _objects(jsonl)
    outcome = _manifest(jsonl)["outcome"]
    assert len(objects) == outcome["raw_log_lines"] == sum(outcome["log_levels"].values())  # one object per call
    assert all(list(o) == ["type", "time", "level", "msg"] and o["type"] == "log" for o in objects)
    assert {o["level"] for o in objects} <= LEVELS
    times = [o["time"] for o in objects]
    assert all(isinstance(t, int) and t > 0 for t in times) and times == sorted(times)  # microseconds, one clock
    assert any(o["level"] == "cont" for o in objects)  # libllama's load dots: pieces of their own
    assert not any(PREFIX.match(o["msg"]) for o in objects)  # no text prefix inside a message
    # every X/Y block is ONE object holding its four lines, and they are the text log's X/Y, in order
    blocks = [o for o in objects if "inconsistent sequence positions" in o["msg"]]
    assert all(o["level"] == "error" and o["msg"].count("\n") == 4 for o in blocks)
    text_xy = XY.findall((text / "raw.log").read_bytes().decode("utf-8", "replace"))
    assert [m for o in blocks for m in XY.findall(o["msg"])] == text_xy
    assert len(text_xy) == (0 if case[2] == "none" else len(blocks)) and (case[2] == "none") == (not blocks)


@pytest.mark.parametrize("case", STALE, ids=[i for c, i in zip(CASES, IDS, strict=True) if c in STALE])
def test_stale_drafter_reads_the_same_in_jsonl(runs: dict, case: tuple) -> None:
    """The verdict, its side, X/Y, every position error and the signature are the text log's."""
    text, jsonl = (analyze.parse(p) for p in runs[case])
    assert (text.meta["log_format"], jsonl.meta["log_format"]) == ("text", "jsonl")
    vt, vj = text.verdict, jsonl.verdict
    assert vt.kind == "inconsistent_positions" and vt.component == "drafter"
    for key in ("kind", "component", "seq_id", "last_pos", "batch_start", "n_position_errors", "summary", "n_errors",
                "n_batches", "n_resets", "acceptance", "confidence", "proof"):
        assert getattr(vj, key) == getattr(vt, key), key
    assert vt.n_position_errors == len(text.errors) > 0
    _same(text.errors, jsonl.errors, drop=("line", "t", "evidence_line", "lines"))
    assert [_texts(x) for x in jsonl.errors["lines"]] == [_texts(x) for x in text.errors["lines"]]
    # the evidence: the same lines (less the text prefix), each on the JSON line of the object that holds it
    assert [PREFIX.sub("", e["text"]) for e in vj.evidence] == [PREFIX.sub("", e["text"]) for e in vt.evidence]
    raw = (runs[case][1] / "raw.log").read_bytes().splitlines()
    for e in vj.evidence:
        assert PREFIX.sub("", e["text"]).strip() in json.loads(raw[e["line"] - 1])["msg"]
    st, sj = match_signature(text), match_signature(jsonl)
    assert st.name == sj.name == "stale_drafter_kv"
    assert sj.match.facts == st.match.facts and sj.match.facts["x"] == vt.last_pos


@pytest.mark.parametrize("case", HEALTHY, ids=[i for c, i in zip(CASES, IDS, strict=True) if c in HEALTHY])
def test_healthy_tables_equal_between_formats(runs: dict, case: tuple) -> None:
    """Counts, attribution and acceptance equal; `t` filled from the objects' `time`; the JSON run's batches on the
    lines its ground truth names."""
    paths = runs[case]
    text, jsonl = (analyze.parse(p) for p in paths)
    for name in ("batches", "kv", "events"):
        _same(getattr(text, name), getattr(jsonl, name))
    assert len(jsonl.batches) > 100 and len(jsonl.kv) > 50 and jsonl.errors.empty
    assert jsonl.verdict.kind == text.verdict.kind and jsonl.verdict.acceptance == text.verdict.acceptance
    assert jsonl.verdict.acceptance["generated"] > 0
    assert match_signature(jsonl).name == match_signature(text).name == "healthy_speculative"
    # `t`: a batch's is the `time` of the object its line is; a find_slot row takes its batch's, as in text
    objects = _objects(paths[1])
    b, kv = jsonl.batches, jsonl.kv
    assert b["t"].notna().all() and kv["t"].notna().all() and (b["t"] > 0).all()
    assert b["t"].tolist() == pytest.approx([objects[n - 1]["time"] / 1e6 for n in b["line"]], abs=1e-9)
    assert (kv["t"] <= [objects[n - 1]["time"] / 1e6 for n in kv["line"]]).all()
    assert b["t"].is_monotonic_increasing and kv["t"].is_monotonic_increasing
    # attribution: each decode's dump found on the line the engine recorded, with its context
    gt = pd.read_parquet(paths[1] / "ground_truth.parquet")
    m = gt.merge(jsonl.batches, on="line", how="left", suffixes=("_gt", ""))
    assert m.batch.notna().all() and (m.pos_min == m.pos_min_gt).all() and (m.n_tokens == m.n_tokens_gt).all()
    assert (m.context.astype(str) == m.context_gt).mean() >= 0.99


def test_cli_log_format(cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KVTRACE_CACHE": str(cache)}
    done = run_kvtrace("capture", "engine", "--fault", "stale-drafter", "--requests", "2", "--cycles", "8",
                       "--log-format", "jsonl", "--out", "s1", "--json", cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = json.loads((tmp_path / "s1" / "raw.log").read_bytes().split(b"\n", 1)[0])
    assert first["type"] == "log" and first["time"] > 0
    triage = run_kvtrace("triage", "--json", "s1", cwd=tmp_path, env=env)
    verdict = json.loads(triage.stdout)
    assert (verdict["kind"], verdict["component"]) == ("inconsistent_positions", "drafter")
    bad = run_kvtrace("capture", "engine", "--log-format", "json", "--out", "s2", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr and b"'json' is not one of" in bad.stderr
    assert not (tmp_path / "s2").exists()


def test_demo_in_jsonl(cache: Path, tmp_path: Path) -> None:
    """`kvtrace demo --log-format jsonl` captures the JSON log and triages it to the ground truth's first X/Y."""
    env = {**os.environ, "KVTRACE_CACHE": str(cache)}
    done = run_kvtrace("demo", "--no-dashboard", "--log-format", "jsonl", "--out", "demo", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert re.search(r"verdict: +inconsistent_positions \(drafter, decided by line \d+\)", out), out
    gt = pd.read_parquet(tmp_path / "demo" / "ground_truth.parquet")
    first = gt[gt.ret != 0].iloc[0]
    assert f"X = {first.drafter_kv_max}   Y = {first.pos_min}" in out
    assert all(o["type"] == "log" for o in _objects(tmp_path / "demo"))
