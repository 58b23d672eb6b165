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


def mirrored_sequences(batches: pd.DataFrame) -> pd.DataFrame:
    """The batches table with each mis-tagged embedding batch (see the module's docstring) given the sequences and
    positions of the target batch it carries: one row per sequence of that batch, as the target's own rows are.
    Such a batch is a drafter's embedding batch of one row, every row an output, numbered on through all its rows,
    right after a target batch of the same size whose sequences are not just the one it names."""
    n = len(batches)
    if n == 0:
        return batches
    numbers = batches["batch"].to_numpy(np.int64)
    starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])  # each batch's first row
    rows_in = np.diff(np.r_[starts, n])
    target = (batches["context"] == "target").to_numpy()
    all_target = np.add.reduceat(target.astype(np.int64), starts) == rows_in
    n_tokens = batches["n_tokens"].to_numpy(np.float64, na_value=np.nan)
    n_outputs = batches["n_outputs"].to_numpy(np.float64, na_value=np.nan)
    lo = batches["pos_min"].to_numpy(np.float64, na_value=np.nan)
    hi = batches["pos_max"].to_numpy(np.float64, na_value=np.nan)
    seq = batches["seq_id"].to_numpy(np.float64, na_value=np.nan)
    embd = batches["embd"].fillna(False).to_numpy(bool)
    s = starts[1:]  # a batch with one before it
    p = starts[:-1]  # that one's first row
    cand = ((rows_in[1:] == 1) & (batches["context"].to_numpy()[s] == "drafter") & embd[s]
            & (n_outputs[s] == n_tokens[s]) & (hi[s] - lo[s] + 1 == n_tokens[s])
            & all_target[:-1] & (n_tokens[p] == n_tokens[s]) & ((rows_in[:-1] > 1) | (seq[p] != seq[s])))
    if not cand.any():
        return batches
    emb_rows = s[cand]
    prev_first, prev_n = p[cand], rows_in[:-1][cand]
    # the copies: each embedding row repeated once per row of its target batch, with that row's sequence and place
    src = np.repeat(emb_rows, prev_n)
    offset = np.arange(int(prev_n.sum())) - np.repeat(np.cumsum(prev_n) - prev_n, prev_n)
    from_target = np.repeat(prev_first, prev_n) + offset
    copies = batches.iloc[src].reset_index(drop=True)
    for col in ("seq_id", "pos_min", "pos_max"):
        copies[col] = batches[col].iloc[from_target].to_numpy()
    keep = np.ones(n, dtype=bool)
    keep[emb_rows] = False
    # in place of the row each copy replaces: ordered by that row, then by the target batch's order
    order = np.r_[np.flatnonzero(keep).astype(np.float64), src + (offset + 1) / (offset.max() + 2)]
    out = pd.concat([batches[keep], copies], ignore_index=True)
    return out.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)
