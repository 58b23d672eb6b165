"""Every `kvtrace ...` command the READMEs show, checked against the real click command tree: the subcommand
exists and every option it uses is one that subcommand (or the group it names) declares. Every
`python benchmarks/NAME.py ...` they show names a script there and only options its argparse declares.

Commands come from the fenced blocks (a `console` block's `$ ` lines, every line of the others but Python) and
from inline code spans; pipes, `&&`, `;`, `&`, redirections and comments are cut off, `\\` continuations
joined, and everything after a `--` is the captured program's, not kvtrace's."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import click
import pytest

from kvtrace.analyze.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]

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
    """A user's guide of at most 600 lines that opens with the two commands doing all set-up; the measurements
    live beside it in benchmarks/README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    first = FENCE.search(text)
    assert first is not None and text[: first.start()].strip() == "# kvtrace"
    assert [line.split("#")[0].strip() for line in first.group(2).splitlines()] == ["make demo", "make test"]
    bench = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert "## Reading speed" in bench and "## What capturing costs the server" in bench


def test_the_readmes_show_every_command() -> None:
    """Each command a user can run appears in an example, and the examples are really found (not zero)."""
    assert sum(1 for doc, _ in DOCUMENTED if doc == "README.md") >= 40
    assert any(doc == "benchmarks/README.md" for doc, _ in DOCUMENTED)
    shown = {tuple(c.split()[1:3]) for _, c in DOCUMENTED} | {tuple(c.split()[1:2]) for _, c in DOCUMENTED}
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


def test_links_between_the_readmes_reach_a_heading() -> None:
    assert _slug("The embedded engine: acceptance and capture time") == "the-embedded-engine-acceptance-and-capture-time"
    checked = 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(((?:benchmarks/)?README\.md)#([\w-]+)\)", text):
            linked = (doc.parent / target) if doc.parent == ROOT else ROOT / target
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", linked.read_text(encoding="utf-8")), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{doc.name}: {target}#{anchor}"
            checked += 1
    assert checked >= 5  # the README's pointers to the measurements are found


def test_the_readme_lists_every_signature_once() -> None:
    """The signature table (what each means, what to do next) has one row for each signature in the catalogue,
    and none for a signature that does not exist."""
    from kvtrace.analyze.findings.signatures import SIGNATURES

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head = text.index("| signature | what it means | next steps it suggests |")
    table = text[head:text.index("\n\n", head)].splitlines()[2:]
    rows = [re.match(r"\| `(\w+)` \|", row) for row in table]
    listed = [m.group(1) for m in rows if m]
    assert len(listed) == len(table)
    assert sorted(listed) == sorted(s.name for s in SIGNATURES)
