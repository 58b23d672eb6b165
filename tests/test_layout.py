"""The dependency rule, the public API and the module list of docs/layout.md, checked against the tree.

Each layer is a folder, and a module's layer is its folder's: the reader (`analyze/reader/`: text to tables and
a verdict; its `session.py`, the session folder's layout, is a leaf) < the findings (`analyze/findings/`) < the
fleet (`analyze/fleet/`); the capture (`capture/`) uses the reader; the views (`analyze/views/`) draw the
findings; the dashboard (`analyze/dashboard/`) serves the views; the command layer (`analyze/cli/`) composes
them all and nothing imports it back; the checkout's `app.py` only hands over to the dashboard's page.
`analyze/__init__.py`, the public API, hands on the reader's names.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analyze", "capture")


def _module_name(path: Path) -> str:
    """The name a module imports by: the folders install under the one top-level name, `kvtrace`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["kvtrace", *parts] if parts[0] in PACKAGES else parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    # extension modules, by their C source: they import nothing of the project
    found |= {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.c"))}
    found["app"] = ROOT / "app.py"
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every project module this one imports, at the top or inside a function, typing-only included."""
    if path.suffix == ".c":
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from pkg import mod` names a module when mod is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in MODULES and t != name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
SCRIPTS = ("app", "kvtrace.analyze.dashboard.app", "kvtrace.analyze.__main__")


FOLDERS = {
    "analyze": "api", "analyze/reader": "reader", "analyze/findings": "findings", "analyze/fleet": "fleet",
    "capture": "capture", "capture/engine": "capture", "analyze/views": "views", "analyze/dashboard": "dashboard",
    "analyze/cli": "cli", ".": "app",
}


def layer(name: str) -> str:
    path = MODULES[name]
    folder = path.parent.relative_to(ROOT).as_posix()
    return "cli" if name == "kvtrace.analyze.__main__" else FOLDERS[folder]


ALLOWED = {
    "reader": {"reader"},
    "api": {"reader"},
    "findings": {"reader", "findings"},
    "fleet": {"api", "reader", "findings", "fleet"},
    "capture": {"api", "reader", "capture"},
    "views": {"api", "reader", "findings", "views"},
    "dashboard": {"api", "reader", "findings", "views", "dashboard"},
    "cli": {"api", "reader", "findings", "fleet", "capture", "views", "dashboard", "cli"},
    "app": {"dashboard"},
}


def _allowed(src: str, dst: str) -> bool:
    return layer(dst) in ALLOWED[layer(src)]


def test_every_folder_has_a_layer() -> None:
    assert {MODULES[n].parent.relative_to(ROOT).as_posix() for n in MODULES} == set(FOLDERS)


def test_every_import_follows_the_layers() -> None:
    bad = [f"{src} imports {dst} ({layer(src)} -> {layer(dst)})" for src, dsts in GRAPH.items() for dst in sorted(dsts)
           if not _allowed(src, dst)]
    assert not bad, "\n".join(bad)


def _bare_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level and n.module]
    return [name for name in names if name.split(".")[0] in PACKAGES]


def test_everything_imports_the_one_top_level_name() -> None:
    """`analyze` and `capture` are folders of the checkout, importable there by accident (the root is on sys.path):
    a module imported by that name would be a second copy of the installed `kvtrace.analyze` or `kvtrace.capture`."""
    paths = [ROOT / "app.py"] + [p for top in ("analyze", "capture", "tools", "benchmarks", "tests")
                                 for p in sorted((ROOT / top).rglob("*.py")) if "fixtures" not in p.parts]
    bad = [f"{p.relative_to(ROOT)}: {name}" for p in paths for name in _bare_imports(p)]
    assert not bad, "\n".join(bad)


def test_nothing_imports_the_command_layer() -> None:
    users = [f"{src} -> {dst}" for src, dsts in GRAPH.items() if layer(src) != "cli" for dst in dsts
             if layer(dst) == "cli"]
    assert not users


def test_session_is_a_leaf() -> None:
    assert GRAPH["kvtrace.analyze.reader.session"] == set()


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def _import_alone(name: str) -> tuple[str, int, str]:
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    return name, proc.returncode, proc.stderr.strip().splitlines()[-1:] and proc.stderr.strip().splitlines()[-1]


def test_every_module_imports_on_its_own_in_a_fresh_interpreter() -> None:
    # the two app.py are Streamlit scripts, not library modules: importing one would run the page
    names = sorted(n for n in MODULES if n not in SCRIPTS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [f"{n}: {err}" for n, rc, err in pool.map(_import_alone, names) if rc != 0]
    assert not failed, "\n".join(failed)


def test_help_imports_no_heavy_module() -> None:
    """`kvtrace --help` and `kvtrace capture run --help` load click, not pandas, the reader or llama.cpp."""
    probe = ("import sys; from kvtrace.analyze.cli import cli\n"
             "for args in (['--help'], ['capture', 'run', '--help'], ['triage', '--help'], ['query', '--help']):\n"
             "    try:\n        cli.main(args, standalone_mode=False)\n    except SystemExit:\n        pass\n"
             "heavy = sorted(m for m in ('pandas', 'numpy', 'pyarrow', 'plotly', 'streamlit', 'llama_cpp', 'httpx',"
             " 'kvtrace.analyze.reader.parser', 'kvtrace.capture.engine.loop', 'kvtrace.capture.wrap', 'dask', 'distributed', 'duckdb')"
             " if m in sys.modules)\n"
             "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert "HEAVY []" in out, out[-500:]


PUBLIC_API = {
    "kvtrace.analyze": ["FileTail", "InputError", "LiveParser", "LiveStats", "ParseResult", "StreamParser", "Verdict", "parse",
                "write_tables"],
    "kvtrace.capture": ["CaptureOptions", "EngineConfig", "EngineError", "EngineResult", "FileSource", "LlamaSwapStream",
                "ModelPair", "Outcome", "RunOptions", "Session", "StdinSource", "Terminal", "UrlSource", "UsageError",
                "ensure_models", "is_session", "list_sessions", "load_chunks", "new_session", "run_attach",
                "run_engine", "run_llama_swap", "run_wrapped"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC_API))
def test_public_api_is_pinned_and_resolves(package: str) -> None:
    import importlib

    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == PUBLIC_API[package]
    for name in mod.__all__:
        assert getattr(mod, name) is not None


def test_docs_layout_lists_every_module() -> None:
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    start = text.index("## Modules")
    end = text.find("\n## ", start + 1)
    section = text[start: end if end > 0 else len(text)]
    listed: set[str] = set()
    for item in re.split(r"\n- ", section)[1:]:
        folder = re.match(r"`([\w/]+/|app\.py)`", item)
        assert folder, item[:60]
        prefix = folder.group(1) if folder.group(1).endswith("/") else ""
        listed.update(prefix + name for name in re.findall(r"`([\w]+\.(?:py|c))`", item))
    files = {str(p.relative_to(ROOT)) for p in [*MODULES.values(), *sorted((ROOT / "tools").glob("*.py"))]}
    assert files - listed == set(), f"modules missing from docs/layout.md: {sorted(files - listed)}"
    assert listed - files == set(), f"docs/layout.md lists modules that do not exist: {sorted(listed - files)}"


def _third_party(path: Path) -> set[str]:
    if path.suffix == ".c":
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_each_layer_keeps_to_its_job() -> None:
    """Streamlit only in the dashboard's runtime; drawing (plotly) only in the views and the dashboard."""
    bad = []
    for name, path in MODULES.items():
        libs = _third_party(path)
        if "streamlit" in libs and layer(name) != "dashboard":
            bad.append(f"{name} ({layer(name)}) imports streamlit")
        if "plotly" in libs and layer(name) not in ("views", "dashboard"):
            bad.append(f"{name} ({layer(name)}) imports plotly")
    assert not bad, "\n".join(bad)


def test_the_wheel_installs_no_top_level_app_module() -> None:
    """The checkout's app.py is for `streamlit run app.py`; an installed kvtrace runs the package's own script."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "py-modules" not in setuptools
    assert "kvtrace.analyze.dashboard" in setuptools["packages"]
    from kvtrace.analyze.dashboard.launch import app_path

    assert app_path().is_relative_to(ROOT / "analyze")
    assert (ROOT / "app.py").read_text(encoding="utf-8").count("\n") <= 6


SCANNED = ("analyze", "capture", "benchmarks", "tools", "app.py")
HELP_KEYWORDS = {"help", "epilog"}  # click options' and commands' texts for users


def _allowed_strings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that may name a session file: docstrings and click help texts. They
    tell a user what a session holds, no code opens a file by them, and a rename shows up in their review."""
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                allowed.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg in HELP_KEYWORDS:
            allowed.update(id(n) for n in ast.walk(node.value))
    return allowed


def _spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every session file name a module's code spells, f-strings' text included."""
    from kvtrace.analyze.reader.session import FILES

    pattern = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(name) for name in FILES) + r")(?!\w)")
    allowed = _allowed_strings(tree)
    return sorted((node.lineno, m[0]) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in allowed
                  and (m := pattern.search(node.value)))


def test_session_file_names_are_spelled_only_in_the_session_module() -> None:
    """analyze/reader/session.py is the one home of a session folder's layout: every other module names its files
    through its constants and functions, so a rename cannot leave one behind."""
    paths = [ROOT / "app.py"] + [p for top in SCANNED[:-1] for p in sorted((ROOT / top).rglob("*.py"))]
    bad = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in paths if path != ROOT / "analyze" / "reader" / "session.py"
           for line, name in _spelled(ast.parse(path.read_text(encoding="utf-8")))]
    assert not bad, "session file names spelled outside analyze/reader/session.py:\n" + "\n".join(bad)


def test_the_layout_check_sees_a_spelled_name() -> None:
    """The check above finds a name in code and in an f-string's text, and lets docstrings and help be."""
    tree = ast.parse('def f(folder, x):\n    """Reads raw.log."""\n    open(folder / "raw.log")\n'
                     '    return f"{x}/manifest.json", f"{x}-raw.log", "my_raw.log", "raw.log.gz"\n'
                     '@click.option("--out", help="where raw.log goes")\ndef g(): pass\n')
    assert _spelled(tree) == [(3, "raw.log"), (4, "manifest.json"), (4, "raw.log"), (4, "raw.log")]
