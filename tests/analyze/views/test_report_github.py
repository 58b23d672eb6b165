"""`kvtrace report --format github`: the comment a workflow posts, checked exactly, against hostile threads and
a 5 MB body; and the sample workflow (samples/github/) linted and checked for what reaches its shell
(tests/analyze/views/test_triage_bot.py runs its steps)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtrace import analyze
from kvtrace.analyze.views.report import GITHUB_LIMIT, GITHUB_MARKER, github_comment, rerun_line
from tests.analyze.reader.test_thread import SEED_GH, gh_json, report

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = ROOT / "samples" / "github" / "kvtrace-triage.yml"
BIN = Path(sys.executable).parent

GOLDEN_THREAD = gh_json(
    "DFlash stops drafting after a few turns. Full log: https://github.com/user-attachments/files/42/server.log\n",
    [("helper", "Which build?"), ("reporter", report("01_beellama-27-dflash-drafter-consecutive.log"))],
    title="invalid reduced-logits token -1")

GOLDEN = """<!-- kvtrace:triage -->

### kvtrace triage: inconsistent\\_positions

**Verdict:** inconsistent\\_positions, failing side: **drafter**, sequence 0\\
**Signature:** `stale_drafter_kv` (Stale drafter KV cache)\\
**Positions:** X = 587, Y = 641 (Y must be 588), 3 position errors

The drafter's KV cache is stale: it stayed at X = 587 while 3 draft batches arrived at the target's position, Y = 641 to 643 (Y must be X + 1).

**Evidence** from [comment 2 by @&#8203;reporter](https://github.com/o/r/issues/1#issuecomment-2) (its line numbers):

```text
 2 | - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 587
 3 | - the tokens for sequence 0 in the input batch have a starting position of Y = 641
 4 | it is required that the sequence positions remain consecutive: Y = X + 1
 5 | decode: failed to initialize batch
 6 | llama_decode: failed to decode, ret = -1
 7 | dflash: drafter decode failed with -1
16 | - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 587
17 | - the tokens for sequence 0 in the input batch have a starting position of Y = 643
18 | it is required that the sequence positions remain consecutive: Y = X + 1
21 | dflash: drafter decode failed with -1
```

The drafter's KV cache kept positions from an earlier request or cycle: its stored max (X) stays fixed while every new draft batch arrives at the target's current position (Y), so llama.cpp refuses each one. The target was rewound or cleared (new prompt, prefix reuse, context shift) and the drafter was not, which is the DFlash bug this tool was built for.

**Next steps:**

- Known fix: beellama.cpp v0.3.0 clears stale drafter KV before drafting (it logs `dflash: clearing stale drafter KV for seq=...`); upgrade and retest.
- Rerun with `LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 GGML_DFLASH_DEBUG=1` and `-v` (or `kvtrace capture run -- llama-server ...`) so every batch and every stored KV position is in the log.

**What is missing** for this kind of failure (checked: the thread has it):

- [ ] the version line (`llama-server --version`)
- [ ] the full command, every flag as it was run
- [ ] the start-up log through the speculative init (model loads, contexts, `common_speculative_init`)
- [ ] `LLAMA_BATCH_DEBUG=1` (every input batch: `init: input batch info` and its `ubatch_print` rows)
- [ ] `LLAMA_KV_CACHE_DEBUG=1` (every stored position: the `find_slot` lines)
- [ ] `GGML_DFLASH_DEBUG=1` (beellama.cpp v0.2-v0.3's DFlash `key=value` lines: `DFLASH_DBG ...`)
- [ ] the device list (`ggml_cuda_init: found ... devices` or `--list-devices`)
- [ ] a rerun captured with kvtrace, which keeps all of the above in one log (`MODEL.gguf`: your model; add every flag the report does not show):

```sh
kvtrace capture run --until-error -- llama-server -m MODEL.gguf
```

**Linked logs, not fetched** (kvtrace reads only what is pasted in the thread):

```text
https://github.com/user-attachments/files/42/server.log
```

<sub>kvtrace edits this comment when the thread changes.</sub>
"""


def comment_of(data: bytes, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "report", "-", "--format", "github", *args], input=data,
                         capture_output=True, check=True)
    return out.stdout.decode("utf-8")


def test_comment_format_exactly() -> None:
    assert comment_of(GOLDEN_THREAD) == GOLDEN


def outside_fences(text: str) -> list[str]:
    """The lines of a GitHub Markdown text that are not inside a fenced code block (CommonMark's rule: a fence
    closes on a line of at least as many backticks and nothing else); fails on a fence left open."""
    out, fence = [], ""
    for line in text.split("\n"):
        if fence:
            if re.fullmatch(rf"{fence}`*[ \t]*", line):
                fence = ""
            continue
        m = re.match(r"(`{3,})[^`]*$", line)
        if m:
            fence = m.group(1)
            continue
        out.append(line)
    assert not fence, "a fence is left open"
    return out


def assert_safe(comment: str) -> None:
    """Log text can neither close a fence, nor mention anyone, nor add HTML: outside the fences there is no
    `@name` (GitHub's mention), no HTML but the marker and the closing line, and the marker comes first, once."""
    assert comment.startswith(GITHUB_MARKER + "\n")
    prose = outside_fences(comment)
    assert prose.count(GITHUB_MARKER) == 1
    for line in prose:
        assert not re.search(r"@[\w-]", line), line
        rest = line.replace(GITHUB_MARKER, "").replace("<sub>", "").replace("</sub>", "")
        assert "<" not in rest.replace("\\<", ""), line
    assert len(comment) <= GITHUB_LIMIT


HOSTILE = "```` @maintainer <img src=x onerror=alert(1)> <!-- kvtrace:triage --> </details>"
HOSTILE_BODY = f"""Logs @everyone <b>bold</b>

~~~
init: the tokens of sequence 0 in the input batch have inconsistent sequence positions: {HOSTILE}
 - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 259
 - the tokens for sequence 0 in the input batch have a starting position of Y = 1361
 it is required that the sequence positions remain consecutive: Y = X + 1
decode: failed to initialize batch
llama_decode: failed to decode, ret = -1 <script>alert(1)</script> [x](javascript:alert(1))
dflash: drafter decode failed with -1 ````` @org/team
~~~
"""


def test_hostile_thread_stays_inside_its_fences() -> None:
    data = gh_json(HOSTILE_BODY, [("evil<b>@x", "run: --spec-draft-model @maint`ai.gguf --spec-type dflash`\n"
                                                "https://gist.github.com/x/@y<script>")])
    comment = comment_of(data)
    assert_safe(comment)
    assert HOSTILE in comment  # the log line is quoted whole, inside the evidence fence
    assert "<script>alert(1)</script>" in comment
    assert "\n``````text\n" in comment  # longer than the five backticks of the log
    assert "X = 259, Y = 1361" in comment
    # the command found in the thread, quoted for a shell, in a fence its backticks cannot close
    rerun = rerun_line(analyze.parse(data))
    assert rerun == ("kvtrace capture run --until-error -- llama-server -m MODEL.gguf --spec-draft-model "
                     "'@maint`ai.gguf' --spec-type 'dflash`'")
    assert f"\n```sh\n{rerun}\n```\n" in comment  # a single backtick cannot close a fence of three
    # the evidence in a comment whose author's login is hostile too: named, escaped, never a mention
    comment = comment_of(gh_json("no log here", [("evil<b>@x", HOSTILE_BODY)]))
    assert_safe(comment)
    assert "**Evidence** from [comment 1 by @&#8203;evil\\<b\\>@&#8203;x](https://github.com/o/r/issues/1#issuecomment-1)" in comment


def test_five_megabyte_body_gives_a_comment_within_the_limit() -> None:
    """A 5 MB body: a long run of failures, 20,000 links, a 2 MB line: the comment stays within GitHub's limit."""
    block = report("01_beellama-27-dflash-drafter-consecutive.log")
    links = "".join(f"see https://github.com/user-attachments/files/{i}/part.log\n" for i in range(20_000))
    huge = "init: " + "`@x<b>" * ((2 << 20) // 6) + "\n"
    body = block + HOSTILE_BODY * 200 + links + huge
    body += block * (((5 << 20) - len(body)) // len(block) + 1)
    body = body[: 5 << 20]
    assert len(body) == 5 << 20
    comment = comment_of(gh_json(body))
    assert_safe(comment)
    assert len(comment) <= GITHUB_LIMIT
    assert "**Linked logs, not fetched (19980 more)**" in comment
    assert "X = 587, Y = 641" in comment


def test_rerun_line_from_the_report() -> None:
    """The capture line is built from the command the report shows: the seed pasted a llama-swap config."""
    seed = analyze.parse(SEED_GH)
    assert rerun_line(seed) == "kvtrace capture llama-swap config.yaml bee_qwen3.6-27b --ping 3 --until-error"
    flags = ("srv  main: llama-server -m t.gguf -md d.gguf --spec-type draft-simple -np 2 --kv-unified -ngl 99\n"
             + report("01_beellama-27-dflash-drafter-consecutive.log"))
    assert rerun_line(analyze.parse(flags.encode())) == (
        "kvtrace capture run --until-error -- llama-server -m MODEL.gguf -md d.gguf --spec-type draft-simple "
        "-np 2 --kv-unified -ngl 99")
    comment = github_comment(seed)
    assert "- [x] the version line" in comment and "- [x] the device list" in comment
    # one item per debug switch, named: this beellama thread's DFlash is the fork's, which has GGML_DFLASH_DEBUG
    for var in ("LLAMA_BATCH_DEBUG", "LLAMA_KV_CACHE_DEBUG", "GGML_DFLASH_DEBUG"):
        assert f"- [ ] `{var}=1` (" in comment


# ---- the sample workflow ---------------------------------------------------------------------------------

def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def test_workflow_passes_actionlint_and_zizmor() -> None:
    for cmd in ([str(BIN / "actionlint"), str(WORKFLOW)],
                [str(BIN / "zizmor"), "--offline", "--persona=pedantic", str(WORKFLOW)]):
        run = subprocess.run(cmd, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_workflow_keeps_the_thread_out_of_its_shell() -> None:
    doc = workflow()
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on == {"issues": {"types": ["opened", "edited"]}, "issue_comment": {"types": ["created"]}}
    assert "pull_request_target" not in WORKFLOW.read_text()
    assert doc["permissions"] == {}
    (job,) = doc["jobs"].values()
    assert job["permissions"] == {"issues": "write"}
    for step in job["steps"]:
        assert "uses" not in step  # nothing but the runner's own Python, curl and jq
        assert "${{" not in step["run"]
        for value in step.get("env", {}).values():  # what the shell sees: the token, numbers and the pin, no text
            assert value in ("${{ github.token }}", "${{ github.repository }}", "${{ github.event.issue.number }}",
                             "${{ vars.KVTRACE_PIP }}")
    # the one pin: a repository variable, read by the install step only (tests/analyze/views/test_triage_bot.py
    # runs the steps)
    assert WORKFLOW.read_text().count("KVTRACE_PIP:") == 1 and "KVTRACE_PIP" not in doc["env"]


@pytest.mark.parametrize("name", ["issues-opened", "issues-edited", "issue_comment-created"])
def test_example_payloads_are_threads_without_a_log(name: str) -> None:
    got = analyze.parse((Path(__file__).parents[2] / "fixtures" / "github" / f"{name}.payload.json").read_bytes())
    assert got.thread is not None and got.verdict.kind == "no_log"
    assert got.verdict.thread is not None and got.verdict.thread["url"] == "https://github.com/Codertocat/Hello-World/issues/1"
