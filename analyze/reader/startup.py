"""Start-up failures that did not stop the server: llama.cpp's own notices, not the run's failures.

With memory fitting on (the server's default), llama.cpp creates each context once to measure it. A drafter
that needs its target's context (DFlash, EAGLE3) cannot be created alone, so the measurement logs
`failed to initialize the context: dflash requires ctx_other to be set (this warning is normal during memory
fitting)` and the server then loads, listens and serves as usual. Two families of such lines are notices:
- a failure line that llama.cpp itself calls normal or expected;
- a start-up (load) failure followed by the server coming up (model loaded, listening, slots idle).
A failure quoted as the reason a runtime's server process died (`llama-server process has terminated: ...
(this warning is normal during memory fitting)`) is no notice: the server did not come up.
They move from the errors table to the events (kind `startup_notice`), so a healthy run reads healthy; a
start-up failure with no server after it stays a failure.
"""

from __future__ import annotations

import json
import re

from kvtrace.analyze.reader.concepts import CRASH
from kvtrace.analyze.reader.records import Event, Failure

# llama.cpp's own words for a message that is not a problem: "(this warning is normal during memory fitting)"
NORMAL_MARK = re.compile(r"\b(?:this|the) (?:warning|error|message|failure) is (?:normal|expected|harmless)\b"
                         r"|\bis normal during\b", re.IGNORECASE)
STARTUP_KINDS = frozenset({"load"})
NOTICE = "startup_notice"


def _text(f: Failure) -> str:
    return " ".join(text for _, text in f.lines) or f.evidence


def split_notices(failures: list[Failure], events: list[Event]) -> tuple[list[Failure], list[Event]]:
    """(the run's failures, start-up notices as events), in log order."""
    ready = min((e.line for e in events if e.kind == "server_ready"), default=None)
    kept: list[Failure] = []
    notices: list[Event] = []
    for f in failures:
        text = _text(f)
        normal = NORMAL_MARK.search(text) is not None and CRASH.regex.search(text) is None
        served_after = f.kind in STARTUP_KINDS and ready is not None and f.line < ready
        if not (normal or served_after):
            kept.append(f)
            continue
        detail = {"variant": f.variant, "failure_kind": f.kind, "why": "marked normal" if normal else "served after",
                  "text": text[:500]}
        notices.append(Event(f.line, f.t, NOTICE, f.component, f.seq_id, None,
                             json.dumps(detail, sort_keys=True, ensure_ascii=False), f.variant))
    return kept, notices
