"""A thread's linked logs, fetched only when asked (`--fetch-links`): GitHub's `user-attachments` files, gists and
raw text links (`.log`/`.txt`, gzipped or not), each read as one more part of the thread, named after its file.

Bounded whatever the link: a size cap on the bytes downloaded and on the text unpacked (a `.gz`, each file of a
`.zip`), a timeout per link, at most `max_links` links, redirects followed a few hops and checked at each hop.
Only http(s); plain http and private addresses (loopback, the LAN, link-local, where a runner's metadata service
lives) only for the GitHub instance kvtrace was told of (`github_url`, `api_url`: GitHub Enterprise, or a test's
server on 127.0.0.1), so a stranger's link cannot make the bot read and quote an internal address. No token is
ever sent. A link that cannot be read is kept with its reason, never an exception.
"""

from __future__ import annotations

import io
import ipaddress
import re
import socket
import time
import zipfile
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlsplit

if TYPE_CHECKING:
    import httpx

    from kvtrace.analyze.reader.thread import Part, Thread

MAX_BYTES = 10 << 20  # downloaded per link: a debug log of a failure is a few MB
MAX_TEXT = 40 << 20  # unpacked per link (a .gz or a .zip's files together): a bomb stops here
TIMEOUT = 20.0  # seconds per link, the whole download
MAX_LINKS = 10
MAX_REDIRECTS = 5
_GIST = re.compile(r"^https?://gist\.github\.com/(?:[\w.-]+/)?(?P<id>[0-9a-f]{6,64})(?:[/#?].*)?$", re.IGNORECASE)
_BINARY_SNIFF = 4096


class LinkError(Exception):
    """One link could not be read; the message says why, in a few words."""


@dataclass(frozen=True, slots=True)
class LinkPolicy:
    """How linked logs are fetched: the caps, and where the GitHub instance is."""

    max_bytes: int = MAX_BYTES
    max_text: int = MAX_TEXT
    timeout: float = TIMEOUT
    max_links: int = MAX_LINKS
    github_url: str = "https://github.com"
    api_url: str = "https://api.github.com"

    def trusted(self, url: str) -> bool:
        """The URL is on the GitHub instance kvtrace was told of (plain http and a private address allowed)."""
        return any(_origin(url) == _origin(base) for base in (self.github_url, self.api_url))


@dataclass(frozen=True, slots=True)
class Fetched:
    file: str  # the file's name: the link's last path segment, a gist's file name, or `archive.zip:member`
    text: str
    size: int  # bytes downloaded


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urlsplit(url)
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, (u.hostname or "").lower(), port


def _check_address(url: str, policy: LinkPolicy) -> None:
    """Refuse a URL kvtrace must not fetch: not http(s), plain http or a private address outside the GitHub
    instance it was told of."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise LinkError("not an http(s) link")
    if policy.trusted(url):
        return
    if u.scheme != "https":
        raise LinkError("plain http: only https links are fetched")
    try:
        infos = socket.getaddrinfo(u.hostname, u.port or 443, proto=socket.IPPROTO_TCP)
    except OSError:
        raise LinkError("its host does not resolve") from None
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_global:
            raise LinkError("a private address: not fetched")


def _download(client: httpx.Client, url: str, policy: LinkPolicy) -> tuple[bytes, str]:
    """The bytes at `url` (redirects followed and checked hop by hop) and the URL they came from."""
    import httpx

    deadline = time.monotonic() + policy.timeout
    for _ in range(MAX_REDIRECTS + 1):
        _check_address(url, policy)
        try:
            with client.stream("GET", url) as resp:
                if resp.is_redirect and "location" in resp.headers:
                    url = urljoin(url, resp.headers["location"])
                    continue
                if resp.status_code != 200:
                    raise LinkError(f"HTTP {resp.status_code}")
                length = resp.headers.get("content-length", "")
                if length.isdigit() and int(length) > policy.max_bytes:
                    raise LinkError(f"{int(length):,} bytes, over the {policy.max_bytes:,}-byte cap")
                data = bytearray()
                for chunk in resp.iter_raw(64 << 10):
                    data += chunk
                    if len(data) > policy.max_bytes:
                        raise LinkError(f"over the {policy.max_bytes:,}-byte cap")
                    if time.monotonic() > deadline:
                        raise LinkError(f"took over {policy.timeout:g} s")
                return bytes(data), url
        except httpx.TimeoutException:
            raise LinkError(f"no answer within {policy.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise LinkError(f"cannot connect ({type(exc).__name__})") from None
    raise LinkError(f"more than {MAX_REDIRECTS} redirects")


def _gunzip(data: bytes, cap: int) -> bytes:
    d = zlib.decompressobj(wbits=47)  # gzip, with its header
    out = bytearray()
    try:
        while data and not d.eof:
            out += d.decompress(data, cap + 1 - len(out))
            if len(out) > cap:
                raise LinkError(f"unpacks to over {cap:,} bytes")
            data = d.unconsumed_tail
            if d.eof and d.unused_data[:2] == b"\x1f\x8b":  # several gzip members, one after another
                data, d = d.unused_data, zlib.decompressobj(wbits=47)
    except zlib.error:
        if not out:
            raise LinkError("not a valid gzip file") from None
    return bytes(out)


def _is_text(data: bytes) -> bool:
    return b"\x00" not in data[:_BINARY_SNIFF]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def unpack(name: str, data: bytes, cap: int = MAX_TEXT) -> list[Fetched]:
    """The text files in downloaded bytes, by content: a gzip, a zip (each text file in it), or text."""
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, cap)
        name = name.removesuffix(".gz")
    if data[:4] == b"PK\x03\x04":
        out: list[Fetched] = []
        left = cap
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    with zf.open(info) as fh:
                        body = fh.read(left + 1)
                    if len(body) > left:
                        raise LinkError(f"unpacks to over {cap:,} bytes")
                    left -= len(body)
                    if body and _is_text(body):
                        out.append(Fetched(f"{name}:{info.filename}", _decode(body), len(data)))
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, zlib.error):
            raise LinkError("not a zip file kvtrace can open") from None
        if not out:
            raise LinkError("no text file in the zip")
        return out
    if not _is_text(data):
        raise LinkError("not text")
    return [Fetched(name, _decode(data), len(data))]


def _file_name(url: str) -> str:
    path = urlsplit(url).path.rstrip("/")
    return unquote(path.rsplit("/", 1)[-1]) or (urlsplit(url).hostname or "link")


def _gist(client: httpx.Client, gist_id: str, policy: LinkPolicy) -> list[Fetched]:
    """Every file of a gist, through the API (a gist's page is HTML)."""
    import json

    api = f"{policy.api_url.rstrip('/')}/gists/{gist_id}"
    data, _ = _download(client, api, policy)
    try:
        doc = json.loads(data)
        files: dict[str, Any] = doc["files"]
    except (ValueError, KeyError, TypeError):
        raise LinkError("the gist API answered something else") from None
    out: list[Fetched] = []
    left = policy.max_text
    for name, f in files.items():
        if not isinstance(f, dict):
            continue
        text = f.get("content")
        if f.get("truncated") or not isinstance(text, str):  # a big file: its raw address has it whole
            raw = f.get("raw_url")
            if not isinstance(raw, str):
                continue
            body, _ = _download(client, raw, policy)
            got = unpack(str(name), body, left)
        else:
            got = [Fetched(str(name), text, len(text.encode()))]
        for g in got:
            left -= len(g.text)
            if left < 0:
                raise LinkError(f"its files hold over {policy.max_text:,} bytes")
            out.append(replace(g, file=f"gist {gist_id}/{g.file}"))
    if not out:
        raise LinkError("an empty gist")
    return out


def fetch(client: httpx.Client, url: str, policy: LinkPolicy) -> list[Fetched]:
    """The text files behind one link of a thread; LinkError when it cannot be read."""
    m = _GIST.match(url)
    if m is not None:
        return _gist(client, m["id"].lower(), policy)
    data, _ = _download(client, url, policy)
    return unpack(_file_name(url), data, policy.max_text)


def fetch_links(thread: Thread, policy: LinkPolicy) -> None:
    """Read the thread's linked logs into it: each file one more part, right after the part that links it
    (labelled with the file's name and that part's), and `thread.fetched` saying what each link gave."""
    import httpx

    from kvtrace.analyze.reader.thread import Part

    linked = list(thread.linked_from().items())
    after: dict[int, list[Part]] = {}
    with httpx.Client(timeout=httpx.Timeout(policy.timeout), follow_redirects=False, trust_env=False,
                      headers={"User-Agent": "kvtrace (linked logs)"}) as client:
        for n, (url, origin) in enumerate(linked):
            if n >= policy.max_links:
                thread.fetched.append({"url": url, "error": f"over {policy.max_links} links: not fetched"})
                continue
            try:
                files = fetch(client, url, policy)
            except LinkError as exc:
                thread.fetched.append({"url": url, "error": str(exc)})
                continue
            where = "the body" if origin.label == "body" else origin.label
            for f in files:
                part = Part(f"{f.file} (linked in {where})", origin.author, url, f.text)
                after.setdefault(id(origin), []).append(part)
                thread.fetched.append({"url": url, "file": f.file, "bytes": f.size, "part": part.label})
    parts: list[Part] = []
    for part in thread.parts:
        parts.append(part)
        parts += after.get(id(part), [])
    thread.parts = parts
