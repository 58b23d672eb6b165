"""Every output says what a verdict stands on (issue 36): a verdict only a sentence shows says so first, in the
text, `report`, `--format github` and the dashboard; a log with no failure says what was measured; the rerun
line and the checklist come from the log's own command and lines, never from a remark in prose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.proof import PROSE_HEADLINE
from kvtrace.analyze.views.report import github_comment, headline, markdown_report, rerun_line

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "samples"

ONE_SENTENCE = b"Server crashes with the drafter, log attached: [server.log](https://github.com/user-attachments/files/7/server.log)\n"
CRASHES = b"The model crashes after a few requests.\n"
CPP_QUOTE = (b"The server aborts when the prompt is long. I think this check is wrong:\n\n```cpp\n"
             b"GGML_ASSERT(n_tokens_all <= cparams.n_batch);\n```\n")
# llama.cpp's bug template, filled in the way the report was: a symptom with no failure line, and one
# acceptance line (llama.cpp's draft statistics line)
GARBAGE_TEMPLATE = b"""### Name and Version

version: 7000 (abcdef0)

### Operating systems

Linux

### Problem description & steps to reproduce

output is garbage after ~2k tokens

### Relevant log output

```
draft acceptance rate = 0.70000 (   70 accepted /   100 generated)
```
"""


def kvtrace(*args: str, data: bytes) -> str:
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args], input=data, capture_output=True,
                         check=True)
    assert not out.stderr
    return out.stdout.decode("utf-8")


@pytest.mark.parametrize("text", [ONE_SENTENCE, CRASHES])
def test_a_prose_verdict_says_so_first_in_every_output(text: bytes) -> None:
    """The one sentence with an attachment gave `speculative_assert` on the drafter side with advice to raise
    its `--ubatch-size`; the crash sentence gave `other` on the target side. Now each output opens with it."""
    first = kvtrace("triage", "-", data=text).splitlines()[0]
    assert first.endswith(PROSE_HEADLINE)
    report = kvtrace("report", "-", data=text)
    assert report.splitlines()[2] == f"**{PROSE_HEADLINE}**"  # under the title, before anything else
    comment = kvtrace("report", "-", "--format", "github", data=text)
    assert comment.splitlines()[2] == f"### kvtrace triage: {PROSE_HEADLINE}"
    for out in (report, comment):
        assert "`told_in_prose`" in out
        assert "ubatch" not in out and "drafter side" not in out and "target side" not in out
        assert "failing side: **unknown**" in out
    v = analyze.parse(text).verdict
    assert (v.proof, v.component, v.component_evidence) == ("prose", "unknown", None)


def test_source_code_alone_gives_no_verdict() -> None:
    out = kvtrace("triage", "--json", "-", data=CPP_QUOTE)
    assert '"kind": "no_log"' in out and '"proof": null' in out and "abort" not in out


def test_any_kind_told_in_prose_says_so() -> None:
    """A draft acceptance told only in the report's words is a prose verdict too, with the same first line."""
    text = b"The run said: draft acceptance rate = 0.75 with MTP\n"
    r = analyze.parse(text)
    assert (r.verdict.kind, r.verdict.proof) == ("draft_stats_only", "prose")
    assert headline(r) == PROSE_HEADLINE
    assert github_comment(r).splitlines()[2] == f"### kvtrace triage: {PROSE_HEADLINE}"


def test_a_healthy_log_says_what_was_measured_never_nothing_to_fix() -> None:
    """The template with "output is garbage after ~2k tokens" and one acceptance line got "Healthy ... Nothing to
    fix"; its comment now says what the verdict rests on, and that no failure is not proof."""
    r = analyze.parse(GARBAGE_TEMPLATE)
    assert (r.verdict.kind, r.verdict.proof) == ("draft_stats_only", "log")
    for out in (github_comment(r), markdown_report(r)):
        assert "nothing to fix" not in out.lower()
    comment = github_comment(r)
    assert "**Measured:** 17 lines read; 0 batches (0 target / 0 drafter / 0 unknown); no failure; draft " \
           "acceptance 70.0% (70 accepted / 100 drafted)." in comment
    assert "not proof that nothing is wrong" in comment


def test_no_failure_found_is_never_followed_by_a_failure() -> None:
    """Headline and signature agree: a llama.cpp log with no failure and no statistics read "No failure found"
    then "The log has a failure ..."."""
    r = analyze.parse(b"srv  params_from_: Chat format: Hermes 2 Pro\nmain: server is listening on http://127.0.0.1:8080\n")
    assert headline(r) == "No failure found"
    for out in (github_comment(r), markdown_report(r)):
        assert "has a failure" not in out and "No failure found" in out


def test_the_rerun_line_never_takes_a_flag_from_prose() -> None:
    """`--parallel 2.` (period included) from a remark replaced the command's real `--parallel 1`."""
    text = (b"I run it like this:\n\n```\nllama-server -m target.gguf -md draft.gguf --spec-type draft-simple "
            b"--parallel 1\n```\n\nI also tried --parallel 2.\n")
    r = analyze.parse(text)
    assert rerun_line(r).endswith("--spec-type draft-simple --parallel 1")
    alone = analyze.parse(b"It crashed; I also tried --parallel 2. Same thing.\n")
    assert "--parallel" not in rerun_line(alone)
    assert "- [ ] the full command" in github_comment(alone)


@pytest.mark.parametrize("sample", ["stale-drafter", "no-rollback"])
def test_the_samples_checklist_finds_their_debug_lines(sample: str) -> None:
    """The project's own samples hold both debug switches' lines; their DFlash is upstream's draft-dflash, which
    never printed GGML_DFLASH_DEBUG's key=value lines, so that switch is not asked for."""
    comment = github_comment(analyze.parse(SAMPLES / sample))
    assert "- [x] `LLAMA_BATCH_DEBUG=1` (" in comment and "- [x] `LLAMA_KV_CACHE_DEBUG=1` (" in comment
    assert "GGML_DFLASH_DEBUG" not in comment.split("**What is missing**")[1]
    assert "--spec-type draft-dflash" in rerun_line(analyze.parse(SAMPLES / sample))  # from the manifest



def test_a_runtime_verdict_keeps_its_lower_confidence_in_every_output() -> None:
    """`triage` said "lower confidence" for a failure read from a runtime's words; `report` and `--format github`
    dropped it."""
    text = b"Error: llama runner process has terminated: signal: aborted (core dumped)\n"
    v = analyze.parse(text).verdict
    assert (v.proof, v.confidence) == ("runtime", "low")
    assert "lower confidence" in kvtrace("triage", "-", data=text)
    assert "lower confidence" in kvtrace("report", "-", data=text)
    assert "lower confidence" in kvtrace("report", "-", "--format", "github", data=text)
