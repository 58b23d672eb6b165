"""The reference in docs/ held to the code it describes, and the code's citations held to the reference.

Each reference table that could drift from the code is read back and compared with what the code has or prints:
the signature catalogue, the verdict kinds, every key of `kvtrace triage --json` and `kvtrace compare --json`,
the tables' columns, `meta`'s keys, the fleet's `verdicts` columns, the triage table's columns, how each
speculative type keeps the drafter's KV, and the scenario matrix.

The code cites docs/ for what llama.cpp prints and why the reader reads it so (`docs/llama-cpp-lines.md#...`).
Every such citation must reach a page and a heading, and no code, test or benchmark may cite notes that a clone
of the repository does not have (section signs, numbered line ids, the old notes' names, paths outside it).
A new docs/ page needs only its line in the guide's Reference list."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.test_readme import headings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _section(page: str, heading: str) -> str:
    """The text of a page's section, from its heading to the next heading of the same or a higher level."""
    text = (DOCS / page).read_text(encoding="utf-8")
    level = len(heading.split(" ", 1)[0])
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(rf"^#{{1,{level}}} ", text[start:], re.MULTILINE)
    return text[start: start + end.start() if end else len(text)]


def _rows(section: str) -> list[list[str]]:
    """The body rows of the first Markdown table in a section, as cells."""
    lines = section.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[start + 2:end]]


def _codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _kvtrace_json(*args: str) -> object:
    run = subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(run.stdout)


# ---- the reference tables against the code ----------------------------------------------------------------

def test_the_signature_table_lists_every_signature_once() -> None:
    """One row for each signature in the catalogue (what it means, what to do next), none for one that does not
    exist."""
    from kvtrace.analyze.findings.signatures import SIGNATURES

    rows = _rows(_section("signatures.md", "## The catalogue"))
    listed = [_codes(r[0])[0] for r in rows]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(s.name for s in SIGNATURES)
    assert all(len(r) == 3 and r[1] and r[2] for r in rows)


def test_the_verdict_kinds_are_the_readers() -> None:
    from kvtrace.analyze.reader.verdict import KINDS

    items = re.findall(r"^\d+\. `(\w+)`", _section("verdict.md", "## Verdict kinds"), re.MULTILINE)
    assert set(items) == set(KINDS)
    assert items[0] == "inconsistent_positions" and items[-1] == "no_log"  # the most serious first


def test_every_key_of_triage_json_is_documented() -> None:
    documented = [_codes(r[0])[0] for r in _rows(_section("verdict.md", "## `kvtrace triage --json`"))]
    printed = _kvtrace_json("triage", "--json", "samples/stale-drafter")
    assert isinstance(printed, dict)
    assert sorted(documented) == sorted(printed)


def test_every_key_of_compare_json_is_documented() -> None:
    from kvtrace.analyze.findings.compare import EXIT_CODES

    section = _section("signatures.md", "## `kvtrace compare`")
    tables = section.split("\n\n")
    verdicts = {_codes(r[0])[0]: int(r[2]) for r in _rows(next(t for t in tables if t.startswith("| verdict |")))}
    assert verdicts == EXIT_CODES
    documented = {key for r in _rows(next(t for t in tables if t.startswith("| key |"))) for key in _codes(r[0])}
    printed = _kvtrace_json("compare", "--json", "samples/stale-drafter", "samples/healthy")
    assert isinstance(printed, dict) and sorted(printed) == ["a", "b", "changes", "verdict"]
    assert documented == set(printed["a"]) == set(printed["b"])


def test_the_table_columns_are_the_readers() -> None:
    from kvtrace.analyze.reader.tables import BATCH_COLUMNS, ERROR_COLUMNS, EVENT_COLUMNS, KV_COLUMNS

    columns = {_codes(r[0])[0]: _codes(r[2])[0].split() for r in _rows(_section("tables.md", "## The tables"))}
    assert columns == {"batches": BATCH_COLUMNS, "kv": KV_COLUMNS, "errors": ERROR_COLUMNS, "events": EVENT_COLUMNS}


def test_every_meta_key_is_documented() -> None:
    """The keys of `meta` on the samples and on the seed report (two GPUs) are the documented ones."""
    from kvtrace import analyze

    documented = {key for r in _rows(_section("tables.md", "## `meta`")) for key in _codes(r[0])}
    seen: set[str] = set()
    for source in ("samples/stale-drafter", "samples/healthy",
                   "tests/fixtures/corpus/00_beellama-28-multigpu-dflash-seed.log"):
        seen |= set(analyze.parse(str(ROOT / source)).meta)
    assert documented == seen


def test_the_fleet_and_triage_table_columns_are_the_codes() -> None:
    from kvtrace.analyze.fleet.dataset import VERDICT_COLUMNS
    from kvtrace.analyze.views.triage import COLUMNS

    fleet = _section("tables.md", "## A fleet's dataset and `kvtrace query`")
    listed = re.search(r"columns\s+`([^`]+)`", fleet)
    assert listed is not None and listed.group(1).split() == list(VERDICT_COLUMNS)
    table = _section("signatures.md", "## `kvtrace triage --table`")
    listed = re.search(r"The columns:\s+`([^`]+)`", table)
    assert listed is not None and listed.group(1).split() == list(COLUMNS)


def test_each_speculative_type_keeps_the_drafter_kv_as_documented() -> None:
    from kvtrace.analyze.reader.spec import drafter_kv

    rows = _rows(_section("speculative-types.md", "## How each type keeps the drafter's KV"))
    checked = 0
    for row in rows:
        mode = _codes(row[1])[0]
        for name in _codes(row[0]):
            if "*" not in name:
                assert drafter_kv(name) == mode, name
                checked += 1
    assert checked >= 12 and {_codes(r[1])[0] for r in rows} == {"mirror", "own", "none"}


def test_the_scenario_tables_are_the_matrix() -> None:
    from tools.scenarios import DESYNC_SEARCH, PROMPT_TOO_LONG, SCENARIOS

    def names(heading: str) -> list[str]:
        return [_codes(r[0])[0] for r in _rows(_section("speculative-types.md", heading))]

    assert names("## The scenario matrix: real llama-server runs") == [s.name for s in SCENARIOS]
    assert names("### The desync search") == [s.name for s in DESYNC_SEARCH]
    assert f"`{PROMPT_TOO_LONG.name}`" in (DOCS / "speculative-types.md").read_text(encoding="utf-8")
    spec_types = {_codes(r[0])[0]: _codes(r[1])[0]
                  for r in _rows(_section("speculative-types.md", "## The scenario matrix: real llama-server runs"))}
    assert spec_types == {s.name: s.spec_type for s in SCENARIOS}


# ---- the code's citations ---------------------------------------------------------------------------------

# Where the project's code, tests and measurements live (tests/fixtures holds strangers' text: not ours to check).
CITING = [p for folder in ("analyze", "capture", "tools", "tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*"))
          if p.is_file() and p.suffix in {".py", ".c", ".md", ".toml", ".yml", ".txt"}
          and "fixtures" not in p.relative_to(ROOT).parts and p != Path(__file__).resolve()]
CITING += [ROOT / "app.py", ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "README.md", ROOT / ".ci" / "run",
           *sorted(DOCS.glob("*.md")), *sorted((ROOT / "samples").rglob("*.md")),
           *sorted((ROOT / "samples").rglob("*.yml"))]

# What points at notes a clone lacks: section signs, the old notes' numbered line ids and names, paths outside
# the repository. `../shared/data` is allowed in benchmarks/ only: an optional real capture next to the checkout,
# which a benchmark uses when it is there and says so when it is not. The engine's `--log-format` option is no
# citation of the old notes.
MISSING_NOTES = re.compile(
    "\u00a7|(?<!--)log-formats?\\b|\\b(?:format|field) notes\\b|speculative-type notes|\\bthe notes'"
    r"|\b[FS]-\d{2}\b|shared/reference|\.\./shared")
CITATION = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
BARE_ANCHOR = re.compile(r"(?<![\w/.#])#([a-z][a-z0-9_]*(?:-[a-z0-9_]+)+)\b")


def missing_notes(path: Path, text: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in MISSING_NOTES.finditer(line):
            allowed = m.group(0) == "../shared" and line[m.end():].startswith("/data") and "benchmarks" in path.parts
            if not allowed:
                out.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    return out


def citation_problems(path: Path, text: str) -> list[str]:
    """Citations of docs/ that reach no page or no heading. In code that cites a page's headings, a bare
    `#anchor` (`docs/llama-cpp-lines.md#batch-dumps and #kv-cache-lines`) names a heading of a page it cites."""
    out = []
    cited: set[str] = set()
    for page, anchor in CITATION.findall(text):
        target = DOCS / page
        if anchor:
            cited.add(page)
        if not target.is_file():
            out.append(f"{path.relative_to(ROOT)}: no docs/{page}")
        elif anchor and anchor not in headings(target):
            out.append(f"{path.relative_to(ROOT)}: no heading docs/{page}#{anchor}")
    if path.suffix == ".py" and cited:
        anchors = set().union(*(headings(DOCS / page) for page in cited if (DOCS / page).is_file()))
        out += [f"{path.relative_to(ROOT)}: #{a} is no heading of {sorted(cited)}"
                for a in BARE_ANCHOR.findall(CITATION.sub("", text)) if a not in anchors]
    return out


def test_no_code_cites_notes_a_clone_lacks() -> None:
    problems = [p for path in CITING for p in missing_notes(path, path.read_text(encoding="utf-8", errors="replace"))]
    assert problems == []


def test_every_citation_of_docs_reaches_a_heading() -> None:
    texts = {path: path.read_text(encoding="utf-8", errors="replace") for path in CITING}
    assert [p for path, text in texts.items() for p in citation_problems(path, text)] == []
    citing = [path for path, text in texts.items() if "docs/llama-cpp-lines.md#" in text and path.suffix == ".py"]
    assert ROOT / "analyze" / "reader" / "patterns.py" in citing and len(citing) >= 10


def test_the_citation_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    code = ROOT / "analyze" / "reader" / "example.py"  # a name only: nothing is written there
    assert citation_problems(code, "# built to docs/llama-cpp-lines.md#the-position-check and #pastes") == []
    assert citation_problems(code, "# docs/llama-cpp-lines.md#no-such-heading") == [
        "analyze/reader/example.py: no heading docs/llama-cpp-lines.md#no-such-heading"]
    assert citation_problems(code, "# docs/llama-cpp-lines.md#pastes and #no-such-heading") == [
        "analyze/reader/example.py: #no-such-heading is no heading of ['llama-cpp-lines.md']"]
    assert citation_problems(code, "# docs/nowhere.md") == ["analyze/reader/example.py: no docs/nowhere.md"]
    old = ("# examples: built to the log-format notes \u00a73.2", "builds=\"beellama.cpp (F-30)\"",
           "(see ../shared/reference/log-formats.md)", "from the field notes")
    assert all(missing_notes(code, line) for line in old)
    assert missing_notes(code, "kvtrace capture engine --log-format jsonl") == []
    bench = ROOT / "benchmarks" / "reader_speed.py"
    assert missing_notes(bench, "captures in ../shared/data/ when present") == []
    assert missing_notes(code, "captures in ../shared/data/ when present") != []


def reference_links(readme: str) -> set[str]:
    """The docs/ pages the guide's "## Reference" list links to (the one place a new page is registered)."""
    start = readme.index("\n## Reference\n")
    end = readme.find("\n## ", start + 1)
    return set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme[start: end if end > 0 else len(readme)]))


def test_every_reference_page_is_listed_in_the_guide() -> None:
    """A new docs/ page needs one line in the guide's Reference list, and the list names no page that is gone."""
    guide = "# g\n\n## Reference\n\n- [A](docs/a.md): a\n- [B](docs/b-c.md#x): b\n\n## Later\n\n[C](docs/c.md)\n"
    assert reference_links(guide) == {"a.md"}  # an anchor is not the page's entry, a link elsewhere is not one
    listed = reference_links((ROOT / "README.md").read_text(encoding="utf-8"))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages - listed == set(), "docs/ pages missing from README.md's Reference list"
    assert listed - pages == set(), "README.md's Reference list names pages docs/ lacks"
