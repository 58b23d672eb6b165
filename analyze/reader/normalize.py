"""Line normalisation: what a raw capture or a bug-report paste wraps around llama.cpp's own text.

Whole chunks get the cheap, line-count-preserving fixes (CRLF, ANSI colour codes). Prefixes (timestamps,
levels, pids, service names, markdown quotes) are only parsed for the few lines that become records,
so the hot loop never pays for them.
"""

from __future__ import annotations

import html
import re
from calendar import timegm
from dataclasses import dataclass
from time import strptime

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Outer prefixes that wrap a llama.cpp line, tried in order until none matches (they can stack:
# `service  | 2026-02-27 15:14:00 [pid] 0.01.002.003 E init: ...`).
# journald's month is in the machine's locale (`Dec 31`, Italian `mar 15`). Read only where a line (or the prefix
# before) starts, in a window of OUTER_WIDTH characters, and anchored there: a search restarting it at every
# character of a long line would enter its eight alternatives a million times.
OUTER_WIDTH = 256  # the longest real prefix (an ISO date, then journald's host and unit[pid]) is under 100
_OUTER = re.compile(
    r"\A(?:(?P<quote>(?:>\s?)+)"
    r"|(?P<fence>`+)"
    r"|(?P<journal_mon>[A-Za-z][a-z]{2}) +(?P<journal_day>\d{1,2}) (?P<journal_hms>\d\d:\d\d:\d\d) \S+ [\w.@-]+\[\d+\]: "
    r"|(?P<date>\d{4}-\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?P<frac>[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? (?:\[\d+\] )?"
    r"(?:\S+ [\w.@-]+\[\d+\]: )?"  # journalctl -o short-iso: the host and unit[pid] after the date
    r"|\[(?P<bdate>\d{4}-\d\d-\d\d)[ T](?P<bhms>\d\d:\d\d:\d\d)(?P<bfrac>[.,]\d+)?\](?: \[\w+\])? "
    r"|\[(?P<epoch>\d{9,10}(?:\.\d+)?)\] "
    r"|\[(?P<tag>\d{1,7})\] "
    r"|(?P<service>[A-Za-z0-9][\w.-]*)\s+\| )"
)
# llama.cpp's own prefix (common/log.cpp): `M.SS.mmm.uuu L `, level letter optional. Its minutes are unbounded in
# llama.cpp; nine digits are 1,900 years of a run, and the bound keeps a search over a run of digits linear.
LLAMA_PREFIX = re.compile(r"(?P<m>\d{1,9})\.(?P<s>\d\d)\.(?P<ms>\d{3})\.(?P<us>\d{3}) (?:(?P<lvl>[IWED]) )?")
_MONTHS = {m: i for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)}


@dataclass(slots=True)
class Prefix:
    """What a line's prefix said: its time, level, and where llama.cpp's message starts."""

    t: float | None = None
    absolute: bool = False  # wall-clock seconds (epoch) rather than seconds since the logger started
    level: str | None = None
    start: int = 0


def decode(data: bytes) -> str:
    """Bytes to text for parsing. Latin-1 never fails, keeps one character per byte (so invalid UTF-8 from
    token pieces costs nothing) and keeps Python's compact one-byte strings, which the hot loop scans
    fastest. Text that leaves the reader goes through `readable`."""
    return data.decode("latin-1")


def readable(text: str) -> str:
    """Text read with `decode`, as the UTF-8 it was written in (invalid bytes become U+FFFD)."""
    return text if text.isascii() else text.encode("latin-1", "replace").decode("utf-8", "replace")


def clean_chunk(text: str) -> str:
    """Drop carriage returns and ANSI colour codes without changing the number of lines."""
    if "\r" in text:  # CRLF becomes LF and a lone CR goes: every CR goes
        text = _drop(text, "\r")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    return text


def _drop(text: str, char: str) -> str:
    """`text` without `char`, which is rare in it: `find` scans for one character at memchr speed, where
    `str.replace(char, "")` walks the text at a third of that (measured on a real capture's chunks)."""
    parts = []
    start = 0
    while (i := text.find(char, start)) >= 0:
        parts.append(text[start:i])
        start = i + 1
    parts.append(text[start:])
    return "".join(parts)


def unescape(line: str) -> str:
    """Undo HTML escaping from a pasted bug report (`&lt;` in `X &lt; Y`)."""
    return html.unescape(line) if "&" in line else line


def llama_seconds(m: re.Match[str]) -> float:
    """Seconds since the logger started, from a LLAMA_PREFIX match."""
    return int(m["m"]) * 60 + int(m["s"]) + int(m["ms"]) / 1e3 + int(m["us"]) / 1e6


def parse_prefix(line: str) -> Prefix:
    """Read the prefixes in front of llama.cpp's message. Only called for lines that become records."""
    out = Prefix()
    m = LLAMA_PREFIX.match(line)
    if m is not None:  # the common case in a raw capture: llama.cpp's own prefix and nothing else
        out.t = llama_seconds(m)
        out.level = m["lvl"]
        out.start = m.end()
        return out
    pos = 0
    n = len(line)
    while pos < n:
        while pos < n and line[pos] == " ":
            pos += 1
        m = _OUTER.match(line[pos: pos + OUTER_WIDTH])
        if m is None or m.end() == 0:
            break
        if m.group("date") or m.group("bdate"):
            date, hms = m.group("date") or m.group("bdate"), m.group("hms") or m.group("bhms")
            frac = m.group("frac") or m.group("bfrac")
            try:
                tm = strptime(f"{date} {hms}", "%Y-%m-%d %H:%M:%S")
                out.t = timegm(tm) + (float("0." + frac[1:]) if frac else 0.0)
                out.absolute = True
            except ValueError:
                pass
        elif m.group("epoch"):
            out.t, out.absolute = float(m.group("epoch")), True
        elif m.group("journal_mon"):
            h, mi, s = (int(x) for x in m.group("journal_hms").split(":"))
            day = int(m.group("journal_day")) + 31 * (_MONTHS.get(m.group("journal_mon").title(), 1) - 1)
            out.t, out.absolute = float(((day * 24 + h) * 60 + mi) * 60 + s), True
        pos += m.end()
    m = LLAMA_PREFIX.match(line, pos)
    if m is None:
        # interleaved stdout can glue characters in front of the prefix
        m = LLAMA_PREFIX.search(line, pos, pos + 200)
        if m is not None and m.group("lvl") is None:
            m = None
    if m is not None:
        out.t = llama_seconds(m)
        out.absolute = False
        out.level = m.group("lvl")
        pos = m.end()
    out.start = pos
    return out


# journalctl's own prefix (short and short-iso): its lines are cut at the terminal width and end in `>`
_JOURNAL = re.compile(r"(?:[A-Za-z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S*) \S+ [\w.@-]+\[\d+\]: ")
_CUT_WORD = re.compile(r"(?<!\S)\S*>$")  # the last word, from its start (not retried inside it)


def uncut(line: str) -> str:
    """A journald line cut at the terminal width (its end replaced by `>`) without its cut last word: a
    number cut there (`is X = 25>` of `X = 2590`) would read as a wrong value. Any other line as it is."""
    if line.endswith(">") and _JOURNAL.match(line) is not None:
        return _CUT_WORD.sub("", line)
    return line


# Where a paste that lost its newlines glued the next line on: a line prefix seen again mid-line (llama.cpp's
# own, a date, a journald prefix, a docker-compose service column). A line is split at these only when one kind
# comes back at least GLUED_MIN times: a single match is a value inside a message.
GLUED_LEN = 400  # shorter lines are never looked at
GLUED_MIN = 3
_GLUED = (
    re.compile(r"(?:^|\s)(\d+\.\d\d\.\d{3}\.\d{3} [IWED] )"),
    re.compile(r"(?:^|\s)(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)"),
    re.compile(r"(?:^|\s)([A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \S+ [\w.@-]+\[\d+\]: )"),
    re.compile(r"(?:^|\s)([A-Za-z0-9][\w.-]*\s+\| )"),
)


def split_glued(line: str) -> list[str] | None:
    """A line that holds many log lines (a paste that lost its newlines: a whole docker-compose log on one
    line) as those lines; None for an ordinary line."""
    if len(line) < GLUED_LEN:
        return None
    for rx in _GLUED:
        starts = [m.start(1) for m in rx.finditer(line)]
        if rx is _GLUED[3]:  # a service column: the same name every time
            names = [line[i: line.index("|", i)].strip() for i in starts]
            top = max(set(names), key=names.count) if names else ""
            starts = [i for i, n in zip(starts, names, strict=True) if n == top]
        if len(starts) >= GLUED_MIN:
            cuts = ([0] if starts[0] > 0 else []) + starts + [len(line)]
            parts = [line[a:b].strip() for a, b in zip(cuts, cuts[1:], strict=False)]
            return [p for p in parts if p]
    return None


WRAP_WIDTH = 120  # a line re-wrapped by a paste (about 72 columns) is no longer than this
# words of the lines a re-wrap splits that matter (the X/Y block, failure lines): only lines holding one are joined
WRAP_CUE = re.compile(r"sequence|position|[XY] =|consecutive|M-RoPE|satisfies|failed|KV cache|the KV|memory module")


def rejoin(head: str, tail: str) -> str | None:
    """`head` and the line after it as the one line a paste re-wrapped into two (`... for sequence 0` then
    `is X = 259`): the tail's own prefixes (a quote, a service name) dropped. None when the two cannot be one
    line: either is long, empty, or neither holds a word the joined line would be read for."""
    if len(head) > 2 * WRAP_WIDTH or len(tail) > WRAP_WIDTH:  # a head may be two pieces joined already
        return None
    rest = tail[parse_prefix(tail).start:].strip()
    body = head.rstrip()
    if not rest or not body or (WRAP_CUE.search(rest) is None and WRAP_CUE.search(body) is None):
        return None
    return f"{body} {rest}"


def message(line: str) -> str:
    """The line with its prefixes and markdown noise removed: what llama.cpp itself printed."""
    text = line[parse_prefix(line).start :]
    return readable(unescape(text.rstrip().rstrip("`").rstrip()))


# a failure's words without what differs between runs: paths cut to their file name; line numbers, addresses and
# other numbers left out (a backend's error or a load error's message, not an assert's condition, which is code)
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/]?(?:[\w.~@+=-]+[\\/])+(?P<base>[\w.+=-]+)")
_LINE_NO = re.compile(r"(\.\w{1,4}):\d+(?::\d+)?")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?!\w)")
WORDS_KEPT = 120  # characters of a message's words that are kept: enough to tell one bug from another


def plain_words(text: str) -> str:
    """`text` without its paths, line numbers, addresses and numbers, its spaces collapsed, cut to WORDS_KEPT."""
    text = text[: 4 * WORDS_KEPT]  # what is kept is at the start; a pasted line can be 1 MB
    text = _NUMBER.sub("N", _HEX.sub("0x…", _LINE_NO.sub(r"\1", _PATH.sub(lambda p: p["base"], text))))
    return " ".join(text.split())[:WORDS_KEPT]
