"""A GitHub thread as input: `gh issue view N --json title,body,comments`, the REST API's issue object or list
of comments (or both in one array, `jq -s`), and an Actions `issues` / `issue_comment` event payload.

Recognised by content, never by file name. The body and each comment are separate pastes of one thread: they
are read one after another as one text, a blank line between them, and `Thread.parts` says which lines came
from which. The title is not read (a title quotes the error, not the log). kvtrace's own comments (they open
with `OWN_MARKER`) are kept aside in `Thread.own`, never read as a report: they quote the evidence they were built
from. Logs attached as links are listed as not fetched, unless asked for (`--fetch-links`,
analyze/reader/links.py): then each file fetched is one more part, named after the file and where it was linked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, TypeGuard

# The opening of every comment kvtrace posts (analyze/views/report.py writes it, the bot finds its comment by it)
OWN_MARKER = "<!-- kvtrace:triage -->"
# A comment's number in its page address (gh's `url`, the REST API's `html_url`), the REST API's id of it
_COMMENT_ID = re.compile(r"#issuecomment-(\d+)$")

# A thread held in memory to be decoded as a whole; a bigger JSON input is read as text.
MAX_THREAD = 64 << 20

# A link in a body: a log attached to the thread (GitHub's uploads, gists, .log/.txt files).
_URL = re.compile(r"https?://[^\s<>()\[\]{}\"'`|\\]+")
# A llama-swap config pasted in a part: a model's key, then (its keys between) its `cmd:`.
_SWAP_MODEL = re.compile(
    r"^(?P<indent>[ \t]*)(?P<model>[\w.:+-]+):[ \t]*\n(?:(?P=indent)[ \t]+\S.*\n)*?(?P=indent)[ \t]+cmd:", re.MULTILINE)
_ATTACHED = re.compile(
    # (user-attachments on any host: GitHub Enterprise serves them at the same path)
    r"https?://(?:[\w.-]+(?::\d+)?/user-attachments/files/|gist\.github\.com/|gist\.githubusercontent\.com/)"
    r"|\.(?:log|txt)(?:\.gz)?(?:[?#].*)?$",
    re.IGNORECASE,
)


# A decoded JSON object: a thread's document comes from strangers, so every value is narrowed before use
JsonObject = dict[str, object]


class PartRange(TypedDict):
    """A part of the thread as the verdict states it: which lines of the read text it holds."""

    part: str
    author: str
    url: str
    first_line: int
    last_line: int


class ThreadInfo(TypedDict):
    """The thread as the verdict states it (`Verdict.thread`)."""

    shape: str
    title: str
    url: str
    parts: list[PartRange]
    evidence_from: str | None
    not_fetched: list[str]
    fetched: list[FetchedLink]  # links read with --fetch-links (analyze/reader/links.py), each file or its error


class FetchedLink(TypedDict):
    """What one link gave: a file read (`file`, `bytes`, `part`: the part it became) or why not (`error`)."""

    url: str
    file: NotRequired[str]
    bytes: NotRequired[int]
    part: NotRequired[str]
    error: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Part:
    """One paste of the thread: the issue's body or one comment."""

    label: str  # "body", "comment 3" (its place in the thread), "comment" (an event's), or a fetched file's name
    author: str  # the login, "" when the JSON does not say
    url: str
    text: str
    comment_id: int | None = None  # the REST API's id of a comment (what an edit of it is addressed by)

    def where(self) -> str:
        """`body`, or `comment 3 by @login at URL`: where a line of the thread was pasted."""
        if self.label == "body":
            return "body"
        by = f" by @{self.author}" if self.author else ""
        at = f" at {self.url}" if self.url else ""
        return f"{self.label}{by}{at}"


@dataclass(slots=True)
class Thread:
    shape: str  # gh, rest, rest-comments, event
    title: str
    url: str
    parts: list[Part]
    first_lines: list[int] = field(default_factory=list)  # the first line of each part in `text()`
    last_lines: list[int] = field(default_factory=list)  # and its last (the blank line after it not counted)
    own: list[Part] = field(default_factory=list)  # kvtrace's own comments, not read
    # links asked for (`--fetch-links`): {"url", "file", "bytes", "part"} for each file read, {"url", "error"}
    # for a link that could not be
    fetched: list[FetchedLink] = field(default_factory=list)

    def text(self) -> str:
        """Every part, in order, one blank line between them; fills `first_lines`."""
        out: list[str] = []
        self.first_lines, self.last_lines = [], []
        line = 1
        for part in self.parts:
            body = part.text.replace("\r\n", "\n").replace("\r", "\n")
            if body and not body.endswith("\n"):
                body += "\n"
            self.first_lines.append(line)
            self.last_lines.append(max(line, line + body.count("\n") - 1))
            out.append(body + "\n")
            line += body.count("\n") + 1
        return "".join(out)

    def part_of(self, line: int) -> tuple[Part, int] | None:
        """The part a line of `text()` belongs to, and the line's number inside that part."""
        found = None
        for part, first in zip(self.parts, self.first_lines, strict=True):
            if line >= first:
                found = (part, line - first + 1)
        return found

    def links(self) -> list[str]:
        """Logs the thread links to rather than pastes, in order, each once."""
        seen: dict[str, None] = {}
        for part in self.parts:
            if part.url in self.fetched_urls():  # a fetched file's own text links nowhere the thread does
                continue
            for m in _URL.finditer(part.text):
                url = m.group(0).rstrip(".,;:!?*_~")
                if _ATTACHED.search(url):
                    seen.setdefault(url, None)
        return list(seen)

    def linked_from(self) -> dict[str, Part]:
        """Each link of `links()` and the part that first links it."""
        out: dict[str, Part] = {}
        for part in self.parts:
            for m in _URL.finditer(part.text):
                url = m.group(0).rstrip(".,;:!?*_~")
                if _ATTACHED.search(url):
                    out.setdefault(url, part)
        return out

    def fetched_urls(self) -> set[str]:
        """The links whose files were read (each one or more parts)."""
        return {f["url"] for f in self.fetched if "error" not in f}

    def not_fetched(self) -> list[str]:
        """The links listed but not read: not asked for, or that failed."""
        done = self.fetched_urls()
        return [u for u in self.links() if u not in done]

    def llama_swap_model(self) -> str | None:
        """The model of a llama-swap config pasted in the thread (the first one whose entry has a `cmd:`)."""
        for part in self.parts:
            m = _SWAP_MODEL.search(part.text.replace("\r\n", "\n"))
            if m is not None and m["model"] not in ("models", "groups", "macros"):
                return m["model"]
        return None

    def describe(self, lines: list[int]) -> ThreadInfo:
        """The thread as the verdict states it: its parts and line ranges, where `lines` (the deciding line
        first) were pasted, and the links not fetched."""
        if not self.first_lines:
            self.text()
        parts = [PartRange(part=p.label, author=p.author, url=p.url, first_line=first, last_line=end)
                 for p, first, end in zip(self.parts, self.first_lines, self.last_lines, strict=True)]
        hit = next((found for n in lines if (found := self.part_of(n)) is not None), None)
        return ThreadInfo(shape=self.shape, title=self.title, url=self.url, parts=parts,
                          evidence_from=hit[0].where() if hit is not None else None, not_fetched=self.not_fetched(),
                          fetched=list(self.fetched))


def _login(obj: JsonObject, key: str) -> str:
    who = obj.get(key)
    return str(who.get("login") or "") if isinstance(who, dict) else ""


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _is_issue(obj: object) -> TypeGuard[JsonObject]:
    return isinstance(obj, dict) and "body" in obj and "title" in obj


def _is_comment(obj: object) -> TypeGuard[JsonObject]:
    return isinstance(obj, dict) and "body" in obj and "title" not in obj


def _comment(obj: JsonObject, label: str) -> Part:
    """A comment in gh's shape (`author`, `url`) or the REST API's (`user`, `html_url`)."""
    author = _login(obj, "author") or _login(obj, "user")
    url = _text(obj.get("html_url")) or _text(obj.get("url"))
    if "api.github.com" in url:  # a REST comment's `url` is the API's; its page is html_url
        url = ""
    rest_id = obj.get("id")
    m = _COMMENT_ID.search(url)
    comment_id = rest_id if isinstance(rest_id, int) else int(m.group(1)) if m is not None else None
    return Part(label, author, url, _text(obj.get("body")), comment_id)


def is_own(obj: object) -> bool:
    """A comment kvtrace posted: its body opens with the marker (whoever wrote it; the bot also checks the author)."""
    return isinstance(obj, dict) and _text(obj.get("body")).lstrip().startswith(OWN_MARKER)


def _split_own(comments: list[Part]) -> tuple[list[Part], list[Part]]:
    """The thread's comments to read, and kvtrace's own, each keeping its place in the thread."""
    return ([c for c in comments if not c.text.lstrip().startswith(OWN_MARKER)],
            [c for c in comments if c.text.lstrip().startswith(OWN_MARKER)])


def _issue(obj: JsonObject) -> tuple[Part, list[Part]]:
    """An issue object and the comments it carries (gh's `comments` array; the REST API's is a count)."""
    body = Part("body", _login(obj, "author") or _login(obj, "user"), _text(obj.get("html_url")),
                _text(obj.get("body")))
    listed = obj.get("comments")
    comments = [c for c in listed if _is_comment(c)] if isinstance(listed, list) else []
    return body, [_comment(c, f"comment {i}") for i, c in enumerate(comments, 1)]


def thread_of(doc: object) -> Thread | None:
    """The thread a decoded JSON document holds, or None when it is not one of the shapes above."""
    if isinstance(doc, dict) and isinstance(doc.get("issue"), dict) and _is_issue(doc["issue"]):
        issue = doc["issue"]
        body, _ = _issue(issue)
        posted = [body]
        if isinstance(doc.get("comment"), dict) and _is_comment(doc["comment"]) and not is_own(doc["comment"]):
            posted.append(_comment(doc["comment"], "comment"))
        return Thread("event", _text(issue.get("title")), _text(issue.get("html_url")), posted)
    if _is_issue(doc):
        body, comments = _issue(doc)
        shape = "gh" if isinstance(doc.get("comments"), list) or "html_url" not in doc else "rest"
        # gh's `url` is the issue's page; the REST API's is its API address, beside `html_url`
        url = _text(doc.get("html_url")) or (_text(doc.get("url")) if shape == "gh" else "")
        read, own = _split_own(comments)
        return Thread(shape, _text(doc.get("title")), url, [body, *read], own=own)
    if isinstance(doc, list) and doc:
        items: list[object] = []
        for item in doc:  # `jq -s . issue.json comments.json`: the issue, then its list of comments
            items.extend(item if isinstance(item, list) else [item])
        if not all(_is_issue(i) or _is_comment(i) for i in items):
            return None
        issues = [i for i in items if _is_issue(i)]
        if len(issues) > 1:
            return None
        parts: list[Part] = []
        title = url = ""
        if issues:
            body, _ = _issue(issues[0])
            parts.append(body)
            title, url = _text(issues[0].get("title")), _text(issues[0].get("html_url"))
        comments = [_comment(c, f"comment {n}") for n, c in enumerate((i for i in items if _is_comment(i)), 1)]
        read, own = _split_own(comments)
        return Thread("rest" if issues else "rest-comments", title, url, parts + read, own=own)
    return None


def looks_like_json(head: bytes) -> bool:
    """The first bytes of an input could open a JSON thread (an object or an array)."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[")


def issues_of(doc: object) -> dict[str, Thread]:
    """The threads of a list of several issues (`gh issue list --json number,title,body,comments,url`), each by
    its number (by its place in the list where the JSON has no numbers); empty for any other document."""
    if not isinstance(doc, list) or len(doc) < 2 or not all(_is_issue(i) for i in doc):
        return {}
    out: dict[str, Thread] = {}
    for place, issue in enumerate(doc, 1):
        number = issue.get("number")
        key = str(number) if isinstance(number, int) and str(number) not in out else f"item{place}"
        thread = thread_of(issue)
        if thread is not None:
            out[key] = thread
    return out


def decode_json(data: bytes) -> object:
    """The JSON document of an input, or None when it is not JSON."""
    if not looks_like_json(data[:4096]):
        return None
    try:
        return json.loads(data.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):  # not JSON (a log of JSON lines, a cut-off paste): read as text
        return None


def thread_keys(path: Path) -> list[str] | None:
    """What a file holds as GitHub threads (by content): None when it is not a thread, `[]` for one thread,
    and each issue's key for a list of issues (each one report, `PATH#KEY`). A folder's `.json` files are read as
    reports only when they are threads, so a session's manifest or a labels file beside them is left alone."""
    try:
        with open(path, "rb") as fh:
            if not looks_like_json(fh.read(64)) or path.stat().st_size > MAX_THREAD:
                return None
            fh.seek(0)
            doc = decode_json(fh.read())
    except OSError:
        return None
    if thread_of(doc) is not None:
        return []
    return list(issues_of(doc)) or None


def read_thread(data: bytes) -> Thread | None:
    """A GitHub thread from the bytes of a whole input, or None (not JSON, or JSON of another shape)."""
    return thread_of(decode_json(data))

