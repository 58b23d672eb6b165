"""The dashboard's server process: `python -m analyze.views.serve [streamlit run arguments]`.

It is `streamlit run`, with the log named by KVTRACE_OPEN already being read (analyze.views.preload) while
streamlit starts; a followed log (KVTRACE_FOLLOW) is read by the page itself as it grows.
"""

from __future__ import annotations

import os
import sys

from analyze.views import preload
from analyze.views.dashboard import FOLLOW_ENV, OPEN_ENV


def main() -> None:
    path = os.environ.get(OPEN_ENV, "").strip()
    if path and os.environ.get(FOLLOW_ENV) != "1":
        preload.start(path)
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
