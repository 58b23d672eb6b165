"""What `--scheduler` costs and gains against the serial run: 1,000+ reports (the corpus copied into a
temporary folder), and one big capture (a path argument), on a real Dask cluster of 1 and 2 workers on
loopback (`dask scheduler` and `dask worker` processes, one thread each). Checks the rows equal the serial
run's and prints seconds, per-report cost and the ratios.

    python benchmarks/cluster_scale.py [--reports 1000] [--capture server.log.gz] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace import analyze  # noqa: E402
from kvtrace.analyze.fleet import cluster  # noqa: E402
from kvtrace.analyze.views.triage import triage_row  # noqa: E402
from tests.analyze.fleet.cluster_procs import dask_processes  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "corpus"


def reports(folder: Path, n: int) -> list[str]:
    logs = sorted(CORPUS.glob("*.log"))
    out = []
    for i in range(n):
        dst = folder / f"r{i // len(logs):03d}" / logs[i % len(logs)].name
        dst.parent.mkdir(exist_ok=True)
        shutil.copy(logs[i % len(logs)], dst)
        out.append(str(dst))
    return out


def on_cluster(workers: int, fn, sources: list[str]) -> tuple[float, list]:  # noqa: ANN001
    from distributed import Client

    with dask_processes(workers=workers, threads=1) as c, Client(c.address, set_as_default=False) as client:
        t0 = time.perf_counter()
        got = cluster.map_logs(client, fn, sources)
        return time.perf_counter() - t0, got


def same_result(a: analyze.ParseResult, b: analyze.ParseResult) -> bool:
    return all(x.equals(b.tables()[k]) for k, x in a.tables().items()) and a.verdict == b.verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--capture", type=Path, help="a big server capture (plain or .gz), parsed whole")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures: dict[str, float | int] = {"reports": args.reports}
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        paths = reports(Path(tmp), args.reports)
        t0 = time.perf_counter()
        serial = [triage_row(p) for p in paths]
        figures["reports_serial_s"] = time.perf_counter() - t0
        for w in (1, 2):
            s, rows = on_cluster(w, partial(triage_row, read=cluster.read), paths)
            assert rows == serial, "the cluster's rows differ from the serial run's"
            figures[f"reports_{w}w_s"] = s
    if args.capture:
        src = str(args.capture)
        t0 = time.perf_counter()
        whole = analyze.parse(src)
        figures["capture_serial_s"] = time.perf_counter() - t0
        for w in (1, 2):
            s, (got,) = on_cluster(w, cluster.read, [src])
            assert same_result(got, whole), "the cluster's tables differ from the serial run's"
            figures[f"capture_{w}w_s"] = s
    if args.json:
        print(json.dumps(figures))
        return
    n = args.reports
    print(f"{n} reports: serial {figures['reports_serial_s']:.2f} s ({1e3 * figures['reports_serial_s'] / n:.1f} ms "
          "a report)")
    for w in (1, 2):
        s = figures[f"reports_{w}w_s"]
        print(f"  {w} worker{'s' if w > 1 else ''}: {s:.2f} s ({1e3 * s / n:.1f} ms a report), "
              f"serial / cluster = {figures['reports_serial_s'] / s:.2f}x")
    if args.capture:
        print(f"{args.capture.name}: serial {figures['capture_serial_s']:.2f} s")
        for w in (1, 2):
            s = figures[f"capture_{w}w_s"]
            print(f"  {w} worker{'s' if w > 1 else ''}: {s:.2f} s, serial / cluster = "
                  f"{figures['capture_serial_s'] / s:.2f}x")


if __name__ == "__main__":
    main()
