"""Whose sequences an upstream drafter's embedding batch carries.

After each target batch, upstream EAGLE3 (llama-server b11434) hands the drafter the target's hidden states as an
embedding batch: one `[embd]` row per row of that target batch, every row an output. With several slots the server
tags every such row as sequence 0 and numbers their positions on through the batch (`seq_id = [0]`, pos 24..35 for
three slots' four rows each, at 24, 26 and 26), so read by its tags slot 0's drafter would run ahead of its target by
the other slots' rows. The rows are those of the slots the target just decoded: the batch takes that target batch's
sequences and positions instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _mirrors(emb: pd.Series, prev_rows: pd.DataFrame) -> bool:
    """Whether one embedding batch's row (`emb`) is the server's mis-tagged copy of the target batch `prev_rows`:
    the same size, every row an output, one sequence numbered on through all the rows, and that sequence is not
    the target batch's only one (a copy of one slot's rows tagged with its own sequence needs nothing)."""
    n = emb["n_tokens"]
    if pd.isna(n) or pd.isna(emb["pos_min"]) or pd.isna(emb["pos_max"]) or pd.isna(emb["n_outputs"]):
        return False
    if (prev_rows["n_tokens"] != n).any() or emb["n_outputs"] != n or emb["pos_max"] - emb["pos_min"] + 1 != n:
        return False
    seqs = set(prev_rows["seq_id"].dropna().astype(int))
    return bool(seqs) and seqs != {int(emb["seq_id"])}


def mirrored_sequences(batches: pd.DataFrame) -> pd.DataFrame:
    """The batches table with each mis-tagged embedding batch (see the module's docstring) given the sequences and
    positions of the target batch it carries: one row per sequence of that batch, as the target's own rows are."""
    if batches.empty:
        return batches
    numbers = batches["batch"].to_numpy(np.int64)
    # candidates: drafter batches of one row, embedding, every row an output
    one_row = pd.Series(numbers).map(pd.Series(numbers).value_counts()).to_numpy() == 1
    cand = (one_row & (batches["context"] == "drafter").to_numpy() & batches["embd"].fillna(False).to_numpy(bool)
            & (batches["n_outputs"] == batches["n_tokens"]).fillna(False).to_numpy(bool))
    if not cand.any():
        return batches
    starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])  # each batch's first row
    index_of = {int(numbers[s]): i for i, s in enumerate(starts)}
    ends = np.r_[starts[1:], len(numbers)]
    replace: dict[int, pd.DataFrame] = {}
    for row in np.flatnonzero(cand):
        k = index_of[int(numbers[row])]
        if k == 0:
            continue
        prev = batches.iloc[starts[k - 1]:ends[k - 1]]
        if not (prev["context"] == "target").all():
            continue
        emb = batches.iloc[row]
        if not _mirrors(emb, prev):
            continue
        rows = pd.DataFrame([emb] * len(prev)).reset_index(drop=True)
        for col in ("seq_id", "pos_min", "pos_max"):
            rows[col] = prev[col].to_numpy()
        replace[int(row)] = rows.astype(batches.dtypes.to_dict())
    if not replace:
        return batches
    parts: list[pd.DataFrame] = []
    last = 0
    for at in sorted(replace):
        parts += [batches.iloc[last:at], replace[at]]
        last = at + 1
    parts.append(batches.iloc[last:])
    return pd.concat(parts, ignore_index=True)
