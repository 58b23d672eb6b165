"""One speculative type has one name in a dataset: llama.cpp's (`draft-dflash`), whether the log named it upstream's
way, a fork's way (`dflash`) or not at all (only a DFlash fork's own lines), so a `GROUP BY spec_type` counts it
once (issue 36, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.analyze.fleet.dataset import parsed, query, write_log
from kvtrace.analyze.reader.spec import llama_name
from tests.conftest import CORPUS

# upstream's implementation line, beellama.cpp's contract line, and a fork's reset line that names no type
# (the examples of patterns.py `spec_impl`, `dflash_named` and `dflash_clear_stale`)
UPSTREAM = "0.00.253.947 I common_speculative_impl_draft_dflash: adding speculative implementation 'draft-dflash'\n"
FORK = ("1.16.873.701 I dflash: contract ok: block_size=16 mask_token=248070 target_layer_ids=[1,16,31,46,61] "
        "n_target_layers=5 n_embd=5120 n_target_features=25600 target_layers=64 cross_ctx=1024\n")
UNNAMED = "1.02.345.678 W dflash: clearing stale drafter KV for seq=0 before flat draft: pos_max=259 next_pos=1361\n"


def test_a_group_by_spec_type_counts_dflash_once(tmp_path: Path) -> None:
    logs = []
    for name, text in (("upstream.log", UPSTREAM), ("fork.log", FORK), ("unnamed.log", UNNAMED)):
        (tmp_path / name).write_text(text, encoding="utf-8")
        logs.append(str(tmp_path / name))
    logs.append(str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log"))  # a real report: `--spec-type dflash`
    dataset = tmp_path / "ds"
    for log in logs:
        write_log(dataset, parsed(log))
    got = query("SELECT spec_type, count(*) AS logs FROM verdicts GROUP BY spec_type", [dataset])
    assert got.values.tolist() == [["draft-dflash", 4]]


@pytest.mark.parametrize(("name", "llama"), [("dflash", "draft-dflash"), ("draft-dflash", "draft-dflash"),
                                             ("eagle3", "draft-eagle3"), ("mtp", "draft-mtp"),
                                             ("draft", "draft-simple"), ("ngram-mod", "ngram-mod"),
                                             ("draft-mtp-adaptive", "draft-mtp-adaptive"), ("", "")])
def test_llama_cpp_s_name_for_each_spelling(name: str, llama: str) -> None:
    assert llama_name(name) == llama
