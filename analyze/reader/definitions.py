"""The definitions the verdict, the signatures and the views share, so each concept means one thing."""

from __future__ import annotations

import pandas as pd

# An event where a KV cache lost positions: a clear or seq_rm that the log names (reset), a stored max
# that fell between two find_slot lines (kv_drop), the target rolled back to a context checkpoint
# (checkpoint_restore). The verdict counts these, the charts and the trace mark these: one set, so a
# dashboard's reset count is the number of reset markers it draws.
# A stale drafter trimmed by the build itself (stale_trim: a turboquant-derived fork's draft mirror and MTP) is one too.
RESET_KINDS = ("reset", "kv_drop", "checkpoint_restore", "stale_trim")

# The command-line flags of b11434's synthetic acceptance: the server, not the drafter, decides what is accepted.
SYNTHETIC_FLAGS = ("--spec-synth-len", "--spec-synth-rates")
# What every view says beside such a run's acceptance numbers, instead of presenting them as the drafter's.
SYNTHETIC_NOTE = ("synthetic acceptance (--spec-synth-len/--spec-synth-rates, for benchmarking): the server chose "
                  "which drafts were accepted, so these numbers say nothing about the drafter's quality")

# Where a draft/verify cycle cannot span: a new request or a reset (the target decodes first after it).
CYCLE_BOUNDARIES = ("new_prompt", "stop", "prompt_done", *RESET_KINDS)


def reset_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events that are resets (RESET_KINDS)."""
    return events[events["kind"].isin(RESET_KINDS)]


def stale_drafter(pos: pd.DataFrame) -> bool:
    """Drafter failures whose X stays put while Y climbs from one failure to the next (the seed report).

    Stale means behind: some draft arrived past the stored max. X fixed with every Y at or below it is a
    drafter that kept its rejected positions (not rolled back), not a stale one. Only the failures at the
    first X count: once the target climbs back to X + 1 (after a later reset), a DFlash noise block lands
    and moves X, which does not make the drafter any less stale.
    """
    d = pos[(pos.component == "drafter") & pos.last_pos.notna() & pos.batch_start.notna()]
    if len(d) < 2:
        return False
    x = int(d.last_pos.iloc[0])
    d = d[d.last_pos == x]
    y = d.batch_start.astype("int64").to_numpy()
    return bool(len(y) >= 2 and (y[1:] > y[:-1]).any() and (y > x + 1).any())
