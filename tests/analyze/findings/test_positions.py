"""Stored positions, drafter minus target and divergence, checked against the engine's API ground truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.positions import (
    choose_axis,
    default_tolerance,
    delta,
    first_divergence,
    stored_positions,
    stretches,
)

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "samples"
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"


@pytest.fixture(scope="module", params=["healthy", "stale-drafter", "no-rollback"])
def sample(request: pytest.FixtureRequest) -> tuple[object, pd.DataFrame]:
    path = SAMPLES / request.param
    return analyze.parse(path), pd.read_parquet(path / "ground_truth.parquet")


def _delta(result: object) -> pd.DataFrame:
    axis = choose_axis(result)
    return delta(stored_positions(result, "target", 0, axis), stored_positions(result, "drafter", 0, axis))


def test_stored_positions_follow_the_api_truth(sample: tuple[object, pd.DataFrame]) -> None:
    result, truth = sample
    axis = choose_axis(result)
    truth = truth.sort_values("line", kind="stable")
    for side in ("target", "drafter"):
        s = stored_positions(result, side, 0, axis)
        assert len(s), side
        assert s["line"].is_monotonic_increasing
        for row in s.itertuples():
            if row.source == "batch":  # only logs without find_slot lines; the samples all have them
                continue
            # The decode whose output holds this line belongs to this side ...
            at = truth[truth["line"] <= row.line].iloc[-1]
            assert at["context"] == side, (side, row.line)
            # ... and what the log says was stored before it is what the API stored after this side's
            # previous decode, less whatever was removed in between (removals only lower it).
            before = truth[(truth["context"] == side) & (truth["line"] < at["line"])]
            ceiling = int(before.iloc[-1][f"{side}_kv_max"]) if len(before) else -1
            assert -1 <= row.pos <= ceiling, (side, row.line, row.pos, ceiling)
            if row.source == "error":
                # a refused decode leaves the cache as it was: X is the API's stored max after it
                assert row.pos == at[f"{side}_kv_max"]


def test_divergence_only_where_the_drafter_really_fell_behind(sample: tuple[object, pd.DataFrame]) -> None:
    result, truth = sample
    runs = stretches(_delta(result), default_tolerance(result))
    failed = truth[truth["ret"] != 0]
    # The API's own view: how far the drafter's cache was from the target's when its decode was refused.
    gaps = (failed["target_kv_max"] - failed["drafter_kv_max"]).abs()
    if gaps.empty or gaps.max() <= default_tolerance(result):
        assert runs == [], "a run whose caches never drifted a block apart must not be shaded"
    else:
        assert runs, "the stale drafter must show as a divergence stretch"
        worst = int(failed.loc[gaps.idxmax(), "line"])
        # the refusal with the widest gap lies inside a shaded stretch
        assert any(r.start_line <= worst <= r.end_line for r in runs), (worst, runs)
        assert max(abs(r.peak) for r in runs) >= gaps.max() - 1


def test_first_divergence_is_the_first_refused_batch(sample: tuple[object, pd.DataFrame]) -> None:
    result, truth = sample
    failed = truth[truth["ret"] != 0]
    d = first_divergence(result, 0, choose_axis(result))
    if failed.empty:
        assert d is None  # no refused decode and caches in step: nothing diverged
        return
    first = failed.iloc[0]
    assert d is not None and d.source == "error"
    # how much: Y - X - 1, from the API's batch start and the drafter's stored max
    assert d.delta == first["pos_min"] - first["drafter_kv_max"] - 1
    assert d.drafter == first["drafter_kv_max"]


def test_seed_report_divergence_comes_from_the_error_block() -> None:
    result = analyze.parse(SEED)
    d = first_divergence(result, 0, choose_axis(result))
    assert d is not None and (d.drafter, d.delta, d.line) == (259.0, 1101.0, 147)
    assert choose_axis(result).kind == "line"


def test_time_axis_prefers_log_timestamps() -> None:
    timed = analyze.parse(SAMPLES / "stale-drafter")
    untimed = analyze.parse(SAMPLES / "no-rollback")
    assert choose_axis(timed).kind == "log_time"
    assert choose_axis(untimed).kind == "line"
    seconds = np.linspace(0, 5, untimed.lines + 1)
    assert choose_axis(untimed, seconds).kind == "capture_time"
    x = choose_axis(untimed, seconds).of(np.array([1, untimed.lines]))
    assert x[0] < x[1] <= 5


def test_log_time_keeps_increasing_across_a_server_restart(tmp_path: Path) -> None:
    # The same capture twice in one file, as when a server restarts into the same log: the logger's clock
    # starts again at 0, the axis must not fold the second run onto the first.
    one = (SAMPLES / "stale-drafter" / "raw.log").read_bytes()
    twice = tmp_path / "restarted.log"
    twice.write_bytes(one + one)
    result = analyze.parse(twice)
    axis = choose_axis(result)
    assert axis.kind == "log_time" and "1 restarts joined" in axis.title
    x = axis.of(result.batches["line"], result.batches["t"])
    assert np.all(np.diff(x) >= 0)
    half = len(result.batches) // 2
    assert x[half:].min() > x[:half].max()


def test_nearby_divergence_bands_merge_without_losing_coverage() -> None:
    from kvtrace.analyze.views.figures import _merge_bands

    x0 = np.array([0.0, 1.0, 1.0005, 50.0])
    x1 = np.array([0.9, 1.0004, 2.0, 60.0])
    m0, m1 = _merge_bands(x0, x1, parts=1000)  # join gaps under 0.06: only 1.0004 -> 1.0005
    np.testing.assert_array_equal(m0, [0.0, 1.0, 50.0])
    np.testing.assert_array_equal(m1, [0.9, 2.0, 60.0])
