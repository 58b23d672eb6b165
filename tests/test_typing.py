"""mypy is strict on every module of the reader and the findings (pyproject.toml's overrides), so a module added
there, or a pattern narrowed, cannot leave one out of `make lint`'s strict check unseen."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRICT_FOLDERS = ("analyze/reader", "analyze/findings")
# the per-module flags strict turns on: an override that turns one off for these modules undoes part of it
STRICT_FLAGS = ("disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls", "disallow_untyped_defs",
                "disallow_incomplete_defs", "check_untyped_defs", "disallow_untyped_decorators", "warn_return_any",
                "warn_unused_ignores", "strict_equality", "extra_checks", "strict")


def _overrides() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = config["tool"]["mypy"].get("overrides", [])
    assert isinstance(found, list)
    return found


def _names(override: dict[str, object]) -> list[str]:
    names = override["module"]
    return [names] if isinstance(names, str) else [str(n) for n in names] if isinstance(names, list) else []


def _matches(pattern: str, module: str) -> bool:
    """mypy's pattern rule: `a.b.*` names a.b and everything under it, any other pattern one module."""
    if pattern.endswith(".*"):
        base = pattern[:-2]
        return module == base or module.startswith(base + ".")
    return module == pattern


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["kvtrace", *parts])


def _strict_modules() -> list[str]:
    return sorted({_module(p) for folder in STRICT_FOLDERS for ext in ("*.py", "*.pyi")
                   for p in (ROOT / folder).glob(ext)})


def test_the_folders_have_modules() -> None:
    modules = _strict_modules()
    assert "kvtrace.analyze.reader.walker" in modules and "kvtrace.analyze.findings.signatures" in modules


def test_every_reader_and_findings_module_is_strict() -> None:
    strict = [n for o in _overrides() if o.get("strict") is True for n in _names(o)]
    left_out = [m for m in _strict_modules() if not any(_matches(p, m) for p in strict)]
    assert left_out == [], f"not under mypy's strict override in pyproject.toml: {left_out}"


def test_no_override_loosens_them() -> None:
    loosened = [(m, key) for o in _overrides() for m in _strict_modules() if any(_matches(p, m) for p in _names(o))
                for key, value in o.items() if (key in STRICT_FLAGS and value is False)
                or (key in ("ignore_errors", "implicit_reexport") and value is True) or key == "follow_imports"]
    assert loosened == [], f"an override undoes strict for: {loosened}"


def test_the_pattern_rule() -> None:
    assert _matches("kvtrace.analyze.reader.*", "kvtrace.analyze.reader")
    assert _matches("kvtrace.analyze.reader.*", "kvtrace.analyze.reader.walker")
    assert not _matches("kvtrace.analyze.reader.*", "kvtrace.analyze.readers")
    assert not _matches("kvtrace.analyze.reader.walker", "kvtrace.analyze.reader.walker2")


def test_the_meta_type_names_every_key_a_parse_writes() -> None:
    """records.Meta is the one typed home of `meta`'s keys: the samples' and the seed report's (two GPUs) meta
    have exactly its keys, so a key written but not typed (or typed but never written) is caught."""
    from kvtrace import analyze
    from kvtrace.analyze.reader.records import Meta

    seen: set[str] = set()
    for source in ("samples/stale-drafter", "samples/healthy",
                   "tests/fixtures/corpus/00_beellama-28-multigpu-dflash-seed.log"):
        seen |= set(analyze.parse(str(ROOT / source)).meta)
    assert seen == set(Meta.__required_keys__ | Meta.__optional_keys__)
