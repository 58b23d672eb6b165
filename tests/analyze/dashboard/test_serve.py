"""The dashboard's server process does before it answers what the first page would otherwise wait for."""

from __future__ import annotations

import subprocess
import sys


def test_the_server_skips_streamlits_run_outside_streamlit_check_on_the_first_element() -> None:
    # In a fresh process, as the server is: the check looks at the stack (every loaded module's source) once.
    code = """
import inspect
from streamlit import delta_generator
from kvtrace.analyze.dashboard import serve
serve._run_by_streamlit()
def refuse(*a, **k):
    raise AssertionError("inspect.stack() on the first element")
inspect.stack = refuse
delta_generator._maybe_print_use_warning()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
