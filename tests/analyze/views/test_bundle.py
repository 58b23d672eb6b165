"""The dashboard's table downloads read back to the reader's own tables."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.views.bundle import zip_tables

ROOT = Path(__file__).resolve().parents[3]


def test_parquet_and_csv_zips_round_trip() -> None:
    result = analyze.parse(ROOT / "samples" / "stale-drafter")
    pq = zipfile.ZipFile(io.BytesIO(zip_tables(result, "parquet")))
    assert set(pq.namelist()) == {"batches.parquet", "kv.parquet", "errors.parquet", "events.parquet",
                                  "meta.parquet", "verdict.json"}
    errors = pd.read_parquet(io.BytesIO(pq.read("errors.parquet")))
    assert errors["batch_start"].tolist() == result.errors["batch_start"].tolist()
    assert json.loads(pq.read("verdict.json"))["kind"] == "inconsistent_positions"
    csv = zipfile.ZipFile(io.BytesIO(zip_tables(result, "csv")))
    batches = pd.read_csv(io.BytesIO(csv.read("batches.csv")))
    assert batches["pos_max"].tolist() == result.batches["pos_max"].tolist()
    with pytest.raises(ValueError):
        zip_tables(result, "xlsx")
