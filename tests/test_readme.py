"""The documents against the code: README.md (the guide), benchmarks/README.md and the reference in docs/.

Every `kvtrace ...` command they show is checked against the real click command tree: the subcommand exists and
every option it uses is one that subcommand (or the group it names) declares. Every `python benchmarks/NAME.py
...` they show names a script there and only options its argparse declares. Commands come from the fenced blocks
(a `console` block's `$ ` lines, every line of the others but Python) and from inline code spans; pipes, `&&`,
`;`, `&`, redirections and comments are cut off, `\\` continuations joined, and everything after a `--` is the
captured program's, not kvtrace's.

Every `console` block that shows kvtrace's output is run: each `$ kvtrace ...` line followed by output lines is
run from a folder that sees the repository's files, and what it prints must read as the excerpt shows it. A line
of just `...` stands for any number of lines left out; runs of white space (an excerpt wraps a long line to stay
within the page's width) count as one space. Output shown as JSON is read as JSON: every key shown must be
printed with the value shown (`"..."` for any value). So an excerpt that drifts from the code fails here. Every
`python` block is run too, and every link between the documents must reach a file and, with an anchor, a
heading."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kvtrace.analyze.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GUIDE_WORDS = 4500  # the guide stays a guide; the reference lives in docs/
LINE_WIDTH = 120

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(kvtrace [^`]+)`")
INLINE_BENCHMARK = re.compile(r"`(python benchmarks/[^`]+)`")
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", ">&", "<&", "&>", "2>"}


def _segments(tokens: list[str], program: str = "kvtrace") -> list[list[str]]:
    """Cut a shell line's tokens at its operators; keep the pieces that run the program, from the program on."""
    pieces: list[list[str]] = [[]]
    skip = False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok in SEPARATORS:
            pieces.append([])
        elif tok in REDIRECTS:
            skip = True  # the file it names is not an argument
        else:
            pieces[-1].append(tok)
    out: list[list[str]] = []
    for piece in pieces:
        if program == "kvtrace":
            at = next((i for i, tok in enumerate(piece) if tok.rsplit("/", 1)[-1] == "kvtrace"), None)
            if at is not None and len(piece) > at + 1:
                out.append(["kvtrace", *piece[at + 1:]])
        else:
            at = next((i for i, tok in enumerate(piece[:-1]) if tok == "python" and piece[i + 1].startswith(program)),
                      None)
            if at is not None:
                out.append(piece[at + 1:])
    return out


def _shell_tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote in an output line: words are enough there
        return line.split()


def block_commands(text: str, program: str = "kvtrace") -> list[str]:
    """The kvtrace (or `python benchmarks/...`) commands of a document's fenced blocks, one string each."""
    found: list[str] = []
    for lang, body in FENCE.findall(text):
        if lang == "python":
            continue
        lines = body.replace("\\\n", " ").splitlines()
        if lang == "console":
            lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
        for line in lines:
            found += [" ".join(seg) for seg in _segments(_shell_tokens(line), program)]
    return found


def inline_commands(text: str) -> list[str]:
    """The kvtrace commands of a document's inline code spans (fences removed first): a synopsis's brackets
    are dropped, so `[--csv]` is checked as `--csv`."""
    prose = FENCE.sub("", text).replace("\n", " ")
    found: list[str] = []
    for span in INLINE.findall(prose):
        first = re.split(r"\s(?:\|\||&&|\||;|&|>)\s", span)[0]
        found.append(" ".join(tok.strip("[]()") for tok in first.split() if tok.strip("[]()")))
    return found


def benchmark_problems(command_line: str) -> list[str]:
    """What in one `benchmarks/NAME.py ...` command line the script does not have: the script itself, or an
    option its argparse parser does not declare (read from its `add_argument` calls, not by running it)."""
    script, *args = command_line.split()
    path = ROOT / script
    if not path.is_file():
        return [f"no script {script}"]
    declared = {"-h", "--help"}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            declared |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return [f"{script}: no option {a.split('=', 1)[0]!r}" for a in args
            if a.startswith("-") and a.split("=", 1)[0] not in declared]


def _option_names(command: click.Command, ctx: click.Context) -> dict[str, click.Parameter]:
    names: dict[str, click.Parameter] = {}
    for param in command.get_params(ctx):
        for name in [*param.opts, *param.secondary_opts]:
            names[name] = param
    return names


def problems(command_line: str) -> list[str]:
    """What in one `kvtrace ...` command line the real command tree does not have (empty when it is all there)."""
    tokens = command_line.split()
    assert tokens and tokens[0] == "kvtrace", command_line
    command: click.Command = cli
    ctx = click.Context(cli, info_name="kvtrace")
    path = ["kvtrace"]
    out: list[str] = []
    i = 1
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            break  # the captured program's own command line
        if isinstance(command, click.Group) and not tok.startswith("-"):
            sub = command.get_command(ctx, tok)
            if sub is None:
                out.append(f"{' '.join(path)}: no subcommand {tok!r}")
                break
            command, path = sub, [*path, tok]
            ctx = click.Context(sub, parent=ctx, info_name=tok)
        elif tok.startswith("-") and tok != "-":
            name = tok.split("=", 1)[0]
            param = _option_names(command, ctx).get(name)
            if param is None:
                out.append(f"{' '.join(path)}: no option {name!r}")
            elif isinstance(param, click.Option) and not (param.is_flag or param.count) and "=" not in tok:
                # skip the option's value(s), so a value is never read as an option or a subcommand
                for _ in range(max(param.nargs, 1)):
                    if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                        i += 1
        i += 1
    return out


def _documented() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        found += [(doc.relative_to(ROOT).as_posix(), c) for c in block_commands(text) + inline_commands(text)]
    return found


DOCUMENTED = _documented()
BENCHMARKS = [
    (doc.relative_to(ROOT).as_posix(), c)
    for doc in DOCS
    for text in [doc.read_text(encoding="utf-8")]
    for c in block_commands(text, "benchmarks/") + INLINE_BENCHMARK.findall(FENCE.sub("", text).replace("\n", " "))
]


@pytest.mark.parametrize(("doc", "command_line"), DOCUMENTED, ids=[f"{d}: {c}"[:90] for d, c in DOCUMENTED])
def test_documented_command_exists_with_its_options(doc: str, command_line: str) -> None:
    assert problems(command_line) == [], f"{doc}: {command_line}"


@pytest.mark.parametrize(("doc", "command_line"), BENCHMARKS, ids=[f"{d}: {c}"[:90] for d, c in BENCHMARKS])
def test_documented_benchmark_exists_with_its_options(doc: str, command_line: str) -> None:
    assert benchmark_problems(command_line.removeprefix("python ")) == [], f"{doc}: {command_line}"


def test_the_readme_is_a_guide_that_opens_with_the_set_up() -> None:
    """A user's guide of at most 4,500 words, no line over 120 characters, that opens with the two commands doing
    all set-up; the reference lives in docs/ and the measurements in benchmarks/README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.split()) <= GUIDE_WORDS
    long = [f"{n}: {len(line)}" for n, line in enumerate(text.splitlines(), 1) if len(line) > LINE_WIDTH]
    assert long == [], f"README.md lines over {LINE_WIDTH} characters (line: length): {long}"
    first = FENCE.search(text)
    assert first is not None and text[: first.start()].strip() == "# kvtrace"
    assert [line.split("#")[0].strip() for line in first.group(2).splitlines()] == ["make demo", "make test"]
    assert "\n## Reference\n" in text and "(#reference)" in text  # the guide points to the reference
    bench = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert "## Reading speed" in bench and "## What capturing costs the server" in bench


def test_the_reference_keeps_its_lines_readable() -> None:
    """docs/ pages keep prose and examples within 120 characters; only table rows may run longer."""
    long = [f"{doc.name}:{n}" for doc in sorted((ROOT / "docs").glob("*.md"))
            for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > LINE_WIDTH and not line.startswith("|")]
    assert long == []
    assert len(list((ROOT / "docs").glob("*.md"))) >= 5


def test_the_readmes_show_every_command() -> None:
    """The guide shows each command a user can run in an example, and the examples are really found (not zero)."""
    in_guide = [c for doc, c in DOCUMENTED if doc == "README.md"]
    assert len(in_guide) >= 30
    assert any(doc == "benchmarks/README.md" for doc, _ in DOCUMENTED)
    assert any(doc.startswith("docs/") for doc, _ in DOCUMENTED)
    shown = {tuple(c.split()[1:3]) for c in in_guide} | {tuple(c.split()[1:2]) for c in in_guide}
    ctx = click.Context(cli)
    capture = cli.get_command(ctx, "capture")
    assert isinstance(capture, click.Group)
    every = [(name,) for name in COMMANDS if name != "capture"]
    every += [("capture", name) for name in capture.list_commands(click.Context(capture, parent=ctx))]
    assert [c for c in every if c not in shown] == []


def test_a_made_up_option_or_command_is_caught() -> None:
    assert problems("kvtrace triage --json server.log") == []
    assert problems("kvtrace triage --no-such-option server.log") == ["kvtrace triage: no option '--no-such-option'"]
    assert problems("kvtrace triage --no-such=3 x") == ["kvtrace triage: no option '--no-such'"]
    assert problems("kvtrace frobnicate x") == ["kvtrace: no subcommand 'frobnicate'"]
    assert problems("kvtrace capture frobnicate") == ["kvtrace capture: no subcommand 'frobnicate'"]
    # an option of another command is not this one's
    assert problems("kvtrace report --perfetto x.json s") == ["kvtrace report: no option '--perfetto'"]
    # the group's own options are checked at the group
    assert problems("kvtrace --help") == [] and problems("kvtrace --frob") == ["kvtrace: no option '--frob'"]


def test_a_made_up_benchmark_option_or_script_is_caught() -> None:
    assert benchmark_problems("benchmarks/reader_speed.py --jobs 2 --pure") == []
    assert benchmark_problems("benchmarks/reader_speed.py --warp 9") == ["benchmarks/reader_speed.py: no option '--warp'"]
    assert benchmark_problems("benchmarks/run_all.py --jobs 2") == ["benchmarks/run_all.py: no option '--jobs'"]
    assert benchmark_problems("benchmarks/nope.py") == ["no script benchmarks/nope.py"]
    assert len(BENCHMARKS) >= 10


def test_what_follows_a_double_dash_is_the_programs_own() -> None:
    assert problems("kvtrace capture run --quiet -- llama-server --any-flag -x") == []
    assert problems("kvtrace capture run --made-up -- llama-server") == ["kvtrace capture run: no option '--made-up'"]


def test_commands_are_cut_from_shell_lines_and_prose() -> None:
    text = (
        "```sh\n"
        "zcat big.log.gz | kvtrace parse - -o tables/   # stdin; --not-an-option in a comment\n"
        "kvtrace capture run --ping 3 -- \\\n  llama-server --port 8080\n"
        "kvtrace report s > comment.md && echo done\n"
        "```\n"
        "```console\n$ kvtrace compare a b\nA: a  (--not-a-command)\n```\n"
        "```python\nkvtrace --not-python\n```\n"
        "Run `kvtrace triage --table FILES... [--csv]` or `kvtrace compare A B && echo ok`; `kvtrace: output`.\n"
    )
    assert block_commands(text) == ["kvtrace parse - -o tables/", "kvtrace capture run --ping 3 -- llama-server --port 8080",
                                    "kvtrace report s", "kvtrace compare a b"]
    assert inline_commands(text) == ["kvtrace triage --table FILES... --csv", "kvtrace compare A B"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (fenced blocks left out)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def link_problems(doc: Path) -> list[str]:
    """The links of one document that reach no file, or a file without the heading their anchor names."""
    out: list[str] = []
    for target in LINK.findall(FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not this repository's
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            out.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in headings(linked):
            out.append(f"{target}: no heading #{anchor}")
    return out


def test_links_between_the_documents_reach_a_file_and_a_heading() -> None:
    assert _slug("The embedded engine: acceptance and capture time") == "the-embedded-engine-acceptance-and-capture-time"
    assert _slug("`kvtrace triage --json`") == "kvtrace-triage---json"
    problems_by_doc = {doc.relative_to(ROOT).as_posix(): link_problems(doc) for doc in DOCS}
    assert {d: p for d, p in problems_by_doc.items() if p} == {}
    checked = sum(len(LINK.findall(FENCE.sub("", doc.read_text(encoding="utf-8")))) for doc in DOCS)
    assert checked >= 60  # the guide's pointers into docs/ and the measurements are found


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-heading) [gone](missing.md) [bad](other.md#no-such) [web](https://x.org/a#b)\n"
                   "```\n[in a fence](nowhere.md)\n```\n", encoding="utf-8")
    assert link_problems(doc) == ["missing.md: no such file", "other.md#no-such: no heading #no-such"]


# ---- console excerpts and Python examples, run ------------------------------------------------------------

def console_excerpts(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each `$ kvtrace ...` line of a console block that shows
    output; a command shown without output is not an excerpt."""
    found: list[tuple[str, list[str]]] = []
    for lang, body in FENCE.findall(text):
        if lang != "console":
            continue
        command: str | None = None
        shown: list[str] = []
        for line in [*body.splitlines(), "$ "]:
            if line.startswith("$ "):
                if command and command.startswith("kvtrace ") and shown:
                    found.append((command, shown))
                command, shown = line[2:].split("  #")[0].strip(), []
            elif command is not None:
                shown.append(line)
    return found


def json_problem(shown: object, printed: object, where: str = "") -> str | None:
    """Why a JSON excerpt does not read as what the command printed (None when it does). Every key shown must be
    printed, with the value shown; keys left out are fine. A string `"..."` stands for any value, a string ending
    in `...` for a value that starts so, and a list's last item `"..."` for items left out."""
    if shown == "...":
        return None
    if isinstance(shown, str) and shown.endswith("...") and isinstance(printed, str):
        return None if printed.startswith(shown[:-3]) else f"{where or '.'}: {printed[:60]!r} is not {shown!r}"
    if isinstance(shown, dict):
        if not isinstance(printed, dict):
            return f"{where or '.'}: printed {type(printed).__name__}, shown an object"
        for key, value in shown.items():
            if key not in printed:
                return f"{where}.{key}: no such key in the output"
            problem = json_problem(value, printed[key], f"{where}.{key}")
            if problem:
                return problem
        return None
    if isinstance(shown, list):
        if not isinstance(printed, list):
            return f"{where or '.'}: printed {type(printed).__name__}, shown a list"
        items, more = (shown[:-1], True) if shown and shown[-1] == "..." else (shown, False)
        if len(printed) < len(items) or (not more and len(printed) != len(items)):
            return f"{where or '.'}: {len(printed)} items printed, {len(items)} shown" + (" and more" if more else "")
        return next((p for i, item in enumerate(items) if (p := json_problem(item, printed[i], f"{where}[{i}]"))),
                    None)
    return None if shown == printed else f"{where or '.'}: printed {printed!r}, shown {shown!r}"


def json_excerpt(shown: list[str]) -> tuple[object] | None:
    """The JSON an excerpt shows, when its output is JSON (one object, pretty-printed or not); else None."""
    text = "\n".join(shown).strip()
    if not text.startswith(("{", "[")):
        return None
    return (json.loads(text),)  # an excerpt that looks like JSON and is not fails here, saying where


def excerpt_problem(shown: list[str], output: str) -> str | None:
    """Why the output shown does not read as the command's real output (None when it does). `...` lines stand for
    lines left out; white space runs count as one space. Output shown as JSON is compared as JSON with the first
    object the command printed (json_problem)."""
    excerpt = json_excerpt(shown)
    if excerpt is not None:
        first = next((line for line in output.splitlines() if line.strip()), "")
        try:
            printed = json.loads(first)
        except json.JSONDecodeError:
            return f"the output is not JSON: {first[:60]!r}"
        return json_problem(excerpt[0], printed)

    def norm(s: str) -> str:
        return " ".join(s.split())

    segments: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            segments.append([])
        else:
            segments[-1].append(line)
    text, at = norm(output), 0
    for i, segment in enumerate(segments):
        if not segment:
            continue
        want = norm("\n".join(segment))
        found = text.find(want, at)
        if found < 0:
            return f"not in the output (in order): {want[:100]!r}"
        if i == 0 and found != 0:
            return "the output starts otherwise (begin the excerpt with a line of ...)"
        at = found + len(want)
    if segments[-1] and at != len(text):
        return f"the output goes on with {text[at:at + 60]!r} (end the excerpt with a line of ...)"
    return None


def _repo_view(tmp_path: Path) -> Path:
    """A working folder that sees the repository's files by their relative paths, so a command's output files
    land there and not in the checkout."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def _run_kvtrace(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command)
    assert args[0] == "kvtrace" and not set(args) & (SEPARATORS | REDIRECTS), f"run as is: {command}"
    env = {**os.environ, "NO_COLOR": "1", "KVTRACE_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


EXCERPTS = [(doc.relative_to(ROOT).as_posix(), command, shown)
            for doc in DOCS for command, shown in console_excerpts(doc.read_text(encoding="utf-8"))]


@pytest.mark.parametrize(("doc", "command", "shown"), EXCERPTS, ids=[f"{d}: {c}"[:90] for d, c, _ in EXCERPTS])
def test_console_excerpts_are_what_the_command_prints(doc: str, command: str, shown: list[str],
                                                      tmp_path: Path) -> None:
    run = _run_kvtrace(command, _repo_view(tmp_path))
    assert run.returncode in (0, 1), f"{doc}: {command} exited {run.returncode}: {run.stderr[-500:]}"
    assert excerpt_problem(shown, run.stdout) is None, f"{doc}: {command}: {excerpt_problem(shown, run.stdout)}"


def test_the_excerpts_are_found_and_a_drifted_one_is_caught() -> None:
    commands = [c for _, c, _ in EXCERPTS]
    assert any(c.startswith("kvtrace triage ") for c in commands) and "kvtrace compare samples/stale-drafter " \
        "samples/healthy" in commands and any(c.startswith("kvtrace report ") for c in commands)
    output = "A: x\n| 1370 | 17 | 16 | -1 | n/a |  |\n| 1395 | 17 | 17 | 0 | 27 | refused batch |\nlast\n"
    assert excerpt_problem(["A: x", "...", "| 1395 | 17 |  17 | 0 | 27 |", "refused batch |", "..."], output) is None
    assert excerpt_problem(["...", "last"], output) is None
    # the report excerpt as it had drifted: its line numbers 4 behind the report's
    assert "not in the output" in (excerpt_problem(["...", "| 1366 | 17 | 16 | -1 | n/a |  |", "..."], output) or "")
    assert "starts otherwise" in (excerpt_problem(["| 1370 | 17 | 16 | -1 | n/a |  |", "..."], output) or "")
    assert "goes on" in (excerpt_problem(["A: x"], output) or "")
    assert any(json_excerpt(shown) for doc, _, shown in EXCERPTS if doc == "README.md")  # a JSON one is checked too
    printed = '{"kind": "kv_slot", "evidence": [{"line": 3, "text": "decode: failed"}, {"line": 4}], "n": 2}\n'
    assert excerpt_problem(['{"kind": "kv_slot",', ' "evidence": [{"line": 3, "text": "decode: ..."}, "..."]}'],
                           printed) is None
    assert excerpt_problem(['{"kind": "...", "n": 2}'], printed) is None
    assert excerpt_problem(['{"kind": "kv_slot", "side": "drafter"}'], printed) == ".side: no such key in the output"
    assert excerpt_problem(['{"n": 3}'], printed) == ".n: printed 2, shown 3"
    assert excerpt_problem(['{"evidence": [{"line": 3}]}'], printed) == ".evidence: 2 items printed, 1 shown"
    assert excerpt_problem(['{"evidence": [{"line": 3, "text": "init: ..."}, "..."]}'], printed) == \
        ".evidence[0].text: 'decode: failed' is not 'init: ...'"
    assert excerpt_problem(['{"n": 2}'], "verdict: fixed\n") == "the output is not JSON: 'verdict: fixed'"
    with pytest.raises(json.JSONDecodeError):
        excerpt_problem(['{"kind": "kv_slot", ...}'], printed)  # JSON shown must be JSON: `...` only as a value
    block = "```console\n$ kvtrace compare a b\nverdict: fixed\n$ kvtrace report s --format html -o r.html\n```\n"
    assert console_excerpts(block) == [("kvtrace compare a b", ["verdict: fixed"])]


PYTHON = [(doc.relative_to(ROOT).as_posix(), body) for doc in DOCS
          for lang, body in FENCE.findall(doc.read_text(encoding="utf-8")) if lang == "python"]


@pytest.mark.parametrize(("doc", "code"), PYTHON, ids=[f"{d}: python {i}" for i, (d, _) in enumerate(PYTHON)])
def test_python_examples_run(doc: str, code: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", code], cwd=_repo_view(tmp_path), capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, f"{doc}: {run.stderr[-800:]}"
    assert PYTHON and any(d == "README.md" for d, _ in PYTHON)
