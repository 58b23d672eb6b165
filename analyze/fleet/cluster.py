"""Many logs on a Dask cluster: each log one task on a worker, a big log's pieces tasks of their own.

The workers read the inputs themselves (a path every worker can see, or an fsspec URL): the client sends
names and gets back what the task made of each log (a triage row, the tables). A big log is cut at
input-batch dumps exactly as `--jobs` cuts it (analyze/reader/split.py), its pieces run as tasks, and the merge runs
in the log's own task, so the rows are the serial reader's. Every task is a pure function of its input: the
scheduler runs again whatever a dying worker had (running, or finished but not yet fetched), and each log's
result is taken once, by its place among the inputs. Nothing here prints; dask is imported only when used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kvtrace.analyze.reader.source import InputError, resolve_path
from kvtrace.analyze.reader.split import MIN_PIECE

if TYPE_CHECKING:
    from distributed import Client

    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.split import Piece, PieceResult

T = TypeVar("T")

EXTRA = "kvtrace[cluster]"
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# a log this big on disk is cut into pieces (a .gz is about a tenth of the log it holds)
SPLIT_PLAIN = 2 * MIN_PIECE
SPLIT_GZ = 1 << 20
CONNECT_TIMEOUT = 10.0  # seconds to reach the scheduler before giving up


class ClusterError(Exception):
    """The cluster cannot be used (the extra is missing, the scheduler cannot be reached): one line."""


def require() -> None:
    """Raise ClusterError naming the extra when dask's distributed scheduler is not installed."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ClusterError(f"--scheduler needs dask's distributed scheduler: pip install '{EXTRA}'") from None


def connect(address: str, timeout: float = CONNECT_TIMEOUT) -> Client:
    """A client of the scheduler at `address` (host:port, or tcp://host:port)."""
    require()
    from distributed import Client

    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {reason}") from None


def is_url(source: str) -> bool:
    return bool(URL.match(source))


def threads(client: Client) -> int:
    """How many tasks the cluster runs at once."""
    return max(1, int(sum(client.nthreads().values())))


def map_logs(client: Client, fn: Callable[[str], T], sources: Sequence[str],
             on_done: Callable[[int, T], None] | None = None) -> list[T]:
    """`fn(source)` for every source on the cluster's workers, in input order; `on_done(i, result)` as each
    arrives. `fn` must be importable by the workers (a top-level function, or a partial of one). A task the
    scheduler runs again (its worker died) is still the one future: each log's result arrives once."""
    from distributed import as_completed

    futures = client.map(fn, list(sources), pure=False)
    place = {f.key: i for i, f in enumerate(futures)}
    out: dict[int, T] = {}
    for future, result in as_completed(futures, with_results=True, loop=client.loop):
        i = place[future.key]
        out[i] = result
        if on_done is not None:
            on_done(i, result)
    return [out[i] for i in range(len(futures))]


def read(source: str, piece_bytes: int | None = None) -> ParseResult:
    """Parse one log on a worker: a URL through fsspec, a path as `analyze.parse` reads it, a big log's
    pieces as tasks on the cluster (`piece_bytes` forces their size: tests cut small logs). Raises
    InputError for a log that cannot be read."""
    from kvtrace import analyze

    if is_url(source):
        return _read_url(source)
    path = resolve_path(source)
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    big = path.stat().st_size >= (SPLIT_GZ if gz else SPLIT_PLAIN)
    if not (big or piece_bytes):
        return analyze.parse(source)
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):  # not on a worker: the pieces stay in this process
        return analyze.parse(source, jobs=1, piece_bytes=piece_bytes)
    # a .gz is unpacked into the worker's temporary folder: its pieces run on that host only
    return analyze.parse(source, jobs=_cluster_threads(), piece_bytes=piece_bytes, map_pieces=_PieceMap(gz))


def _read_url(source: str) -> ParseResult:
    import fsspec

    from kvtrace import analyze

    try:
        with fsspec.open(source, "rb") as f:
            return analyze.parse(f, name=source)
    except (OSError, ValueError, ImportError) as exc:  # missing, refused, or a protocol fsspec cannot load
        raise InputError(f"{source}: cannot read ({exc})") from None


def _cluster_threads() -> int:
    from distributed import worker_client

    with worker_client() as client:
        return max(2, threads(client))


class _PieceMap:
    """Runs a big log's pieces as tasks from inside the log's own task (worker_client: the task gives up
    its thread while it waits, so the pieces can run on it too)."""

    def __init__(self, same_host: bool) -> None:
        self.same_host = same_host

    def __call__(self, work: Callable[[tuple[str, Piece]], PieceResult],
                 args: list[tuple[str, Piece]]) -> Iterable[PieceResult]:
        from distributed import get_worker, worker_client
        from distributed.comm.addressing import get_address_host

        options: dict[str, Any] = {}
        if self.same_host:
            options = {"workers": [get_address_host(get_worker().address)], "allow_other_workers": False}
        with worker_client() as client:
            futures = client.map(work, args, pure=False, **options)
            results: list[PieceResult] = client.gather(futures)
        return results


__all__ = ["EXTRA", "ClusterError", "connect", "is_url", "map_logs", "read", "require", "threads"]
