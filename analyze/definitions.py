"""The definitions the verdict, the signatures and the views share, so each concept means one thing."""

from __future__ import annotations

import pandas as pd


def stale_drafter(pos: pd.DataFrame) -> bool:
    """Drafter failures whose X stays put while Y climbs from one failure to the next (the seed report).

    Stale means behind: some draft arrived past the stored max. X fixed with every Y at or below it is a
    drafter that kept its rejected positions (not rolled back), not a stale one.
    """
    d = pos[(pos.component == "drafter") & pos.last_pos.notna() & pos.batch_start.notna()]
    if len(d) < 2 or d.last_pos.nunique() != 1:
        return False
    y = d.batch_start.astype("int64").to_numpy()
    x = int(d.last_pos.iloc[0])
    return bool((y[1:] > y[:-1]).any() and (y > x + 1).any())
