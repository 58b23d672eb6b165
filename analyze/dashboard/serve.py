"""The dashboard's server process: `python -m kvtrace.analyze.dashboard.serve [streamlit run arguments]`.

It is `streamlit run`, with the log named by KVTRACE_OPEN already being read (kvtrace.analyze.dashboard.preload) while
streamlit starts; a followed log (KVTRACE_FOLLOW) is read by the page itself as it grows.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from kvtrace.analyze.dashboard import preload
from kvtrace.analyze.dashboard.launch import FOLLOW_ENV, OPEN_ENV

# What the page's first run imports, loaded before the server answers (while the log is read beside it): on a
# fresh server the first page otherwise waited about a second more for pandas, plotly and the reader. Not in a
# thread: streamlit's own imports running at the same time would meet half-initialised modules.
WARM_MODULES = ("numpy", "pandas", "pyarrow", "plotly.graph_objects", "plotly.io", "kvtrace.analyze",
                "kvtrace.analyze.reader.parser", "kvtrace.analyze.reader.devices", "kvtrace.analyze.views.bundle",
                "kvtrace.analyze.views.figures", "kvtrace.analyze.dashboard.follow",
                "kvtrace.analyze.findings.overview", "kvtrace.analyze.findings.positions",
                "kvtrace.analyze.findings.chart", "kvtrace.analyze.dashboard.rawtext", "kvtrace.analyze.views.report",
                "kvtrace.analyze.dashboard.page")


# Streamlit's caches check their parameters when a function is decorated, and warn "No runtime found, using
# MemoryCacheStorageManager" when that happens before its runtime exists, as the warm imports do. The check is
# all that runs then (each cache is made on its first call, inside the runtime), so that warning says nothing.
QUIET_LOGGERS = ("streamlit.runtime.caching.cache_data_api",)


def _not_no_runtime(record: logging.LogRecord) -> bool:
    return "No runtime found" not in record.getMessage()


def _warm() -> None:
    import streamlit.runtime.caching  # noqa: F401 - its loggers exist (and are set up) before the filter goes on

    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    for logger in loggers:
        logger.addFilter(_not_no_runtime)
    try:
        for name in WARM_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the page imports it again and shows what is wrong
                return
    finally:
        for logger in loggers:
            logger.removeFilter(_not_no_runtime)


def _run_by_streamlit() -> None:
    """Streamlit checks, on the first element a process sends, whether the script runs outside `streamlit run`
    (to say how to view it): `inspect.stack()` over the sources of every loaded module, 0.15-0.3 s with the
    modules warmed above, paid by the first page. This process is always `streamlit run`: the check is skipped."""
    from streamlit import delta_generator

    if hasattr(delta_generator, "_use_warning_has_been_displayed"):
        delta_generator._use_warning_has_been_displayed = True  # noqa: SLF001


def main() -> None:
    path = os.environ.get(OPEN_ENV, "").strip()
    if path and os.environ.get(FOLLOW_ENV) != "1":
        preload.start(path)
    _warm()
    _run_by_streamlit()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    try:
        sys.exit(cli.main())
    finally:
        preload.discard()  # a log no page asked for leaves no process and no file behind


if __name__ == "__main__":
    main()
