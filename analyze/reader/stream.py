"""The live side of the reader: bytes fed as they arrive (a capture's live view), running counts at any time, and
the tables from `analyze.StreamParser`. Imports only the walker: a capture's live parse starts in a quarter of the
reader's start-up (no pandas)."""

from __future__ import annotations

from kvtrace.analyze.reader.normalize import clean_chunk, decode
from kvtrace.analyze.reader.records import CONTEXT_NAMES, NA, LiveStats
from kvtrace.analyze.reader.startup import split_notices
from kvtrace.analyze.reader.walker import Walker


class LiveParser:
    """Feed bytes as they arrive (a live capture); ask for running stats at any time. `analyze.StreamParser`
    adds the tables (snapshot, finish)."""

    def __init__(self, name: str = "<stream>") -> None:
        self.name = name
        self.walker = Walker()
        self._carry = b""
        self.n_bytes = 0
        self.warnings: list[str] = []

    def feed(self, data: bytes) -> None:
        self.n_bytes += len(data)
        data = self._carry + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._carry = data[-(1 << 20):]
            return
        self._carry = data[cut + 1 :]
        self.feed_text(decode(data[: cut + 1]))

    def feed_text(self, text: str) -> None:
        """Whole lines of text (what `feed` cut at a line break)."""
        self.walker.feed_text(clean_chunk(text))

    def stats(self) -> LiveStats:
        """Running counts for a status line. Contexts here are provisional (largest cache = target)."""
        w = self.walker
        failures = w.failures + ([w.open_failure] if w.open_failure is not None else [])  # open: still seen
        if failures:  # the triage's start-up rule: a line llama.cpp calls normal, or a load the server outlived
            failures, _ = split_notices(failures, w.events)
        out = LiveStats(lines=w.n_lines, batches=len(w.batches), errors=len(failures),
                        position_errors=sum(f.has_block for f in failures))
        kv = w.kv
        if len(kv):
            sizes = sorted(set(kv.cache_size[-64:]), reverse=True)
            for i in range(len(kv) - 1, max(-1, len(kv) - 256), -1):
                if kv.cache_size[i] == sizes[0]:
                    if out.target_pos is None:
                        out.target_pos = int(kv.pos_max[i])
                elif out.drafter_pos is None:
                    out.drafter_pos = int(kv.pos_max[i])
        elif len(w.batches):
            hi = w.batches.pos_max[-1]
            pos = None if hi == NA else int(hi)
            if CONTEXT_NAMES.get(int(w.batches.hint[-1]), "unknown") == "drafter":
                out.drafter_pos = pos
            else:
                out.target_pos = pos
        return out
