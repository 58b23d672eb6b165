"""The reader's tables as one zip (Parquet or CSV), the same files `kvtrace parse -o DIR` writes.

For the dashboard's downloads: a browser gets one file, not a folder.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import TYPE_CHECKING

from kvtrace.analyze.reader.session import VERDICT

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

FORMATS = ("parquet", "csv")


def zip_tables(result: ParseResult, fmt: str = "parquet") -> bytes:
    """batches, kv, errors, events and meta as `<name>.<fmt>`, plus verdict.json, in one zip."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, frame in result.tables().items():
            out = io.BytesIO()
            if fmt == "parquet":
                frame.to_parquet(out, index=False)
            else:
                frame.to_csv(out, index=False)
            zf.writestr(f"{name}.{fmt}", out.getvalue())
        zf.writestr(VERDICT, json.dumps(result.verdict.to_dict(), indent=2, default=str) + "\n")
    return buf.getvalue()
