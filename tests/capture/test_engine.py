"""The embedded engine on real llama.cpp: healthy runs keep the drafter at the target's position, and each
fault makes llama.cpp itself refuse the drafter's batch with its real error, matching the API's truth.

draft-dflash runs a real upstream `dflash` drafter through llama.cpp's own DFlash graph; draft-simple a plain
llama drafter (block: [id_last, mask x k] in one batch; chain: k one-token decodes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from kvtrace.analyze.reader.session import Session, free_port, new_session
from kvtrace.capture.engine import GROUND_TRUTH_COLUMNS, EngineConfig, EngineError, EngineResult, run_engine
from kvtrace.capture.models import (
    ModelParams,
    _write_upstream_drafter,
    ensure_models,
    ensure_upstream_drafter,
    sha256_file,
)

from .capture_helpers import run_kvtrace, start_kvtrace, wait_for

pytestmark = pytest.mark.engine

PREFIX = re.compile(rb"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ")
ERROR_BLOCK = re.compile(
    rb"init: the tokens of sequence (\d+) in the input batch have inconsistent sequence positions:\n"
    rb" - the last position stored in the memory module of the context \(i\.e\. the KV cache\) "
    rb"for sequence \1 is X = (-?\d+)\n"
    rb" - the tokens for sequence \1 in the input batch have a starting position of Y = (-?\d+)\n"
    rb" it is required that the sequence positions remain consecutive: Y = X \+ 1\n"
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("engine-models")
    ensure_models(path, seed=0)
    ensure_upstream_drafter("dflash", path, seed=0)
    ensure_upstream_drafter("eagle3", path, seed=0)
    return path


@pytest.fixture(scope="module")
def capture(cache: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Run the engine once per distinct setting within this module."""
    done: dict[tuple, EngineResult] = {}
    root = tmp_path_factory.mktemp("engine-sessions")

    def run(**kw: object) -> EngineResult:
        key = tuple(sorted(kw.items()))
        if key not in done:
            cfg = EngineConfig(cache_dir=cache, **kw)  # type: ignore[arg-type]
            done[key] = run_engine(cfg, new_session("engine", str(len(done)), root=root))
        return done[key]

    return run


def truth(result: EngineResult) -> pd.DataFrame:
    return pd.read_parquet(result.session / "ground_truth.parquet")


def raw_lines(result: EngineResult) -> list[bytes]:
    return (result.session / "raw.log").read_bytes().split(b"\n")


def position_errors(result: EngineResult) -> list[tuple[int, int, int]]:
    """(seq, X, Y) of every position error llama.cpp printed, in order."""
    text = (result.session / "raw.log").read_bytes()
    return [(int(s), int(x), int(y)) for s, x, y in ERROR_BLOCK.findall(text)]


# -- healthy ------------------------------------------------------------------------------------------


SIMPLE = "draft-simple"
DFLASH = "draft-dflash"
EAGLE3 = "draft-eagle3"


@pytest.mark.parametrize(
    ("spec", "draft", "drafting"),
    [(DFLASH, 1, "block"), (DFLASH, 3, "block"), (DFLASH, 8, "block"),
     (SIMPLE, 1, "block"), (SIMPLE, 4, "block"), (SIMPLE, 8, "block"), (SIMPLE, 3, "chain")],
)  # fmt: skip
def test_healthy_drafter_ends_every_cycle_at_the_targets_position(capture, spec: str, draft: int,
                                                                   drafting: str) -> None:
    result = capture(fault="none", spec_type=spec, draft=draft, drafting=drafting, requests=4, cycles=24)
    gt = truth(result)
    assert result.n_failures == 0 and (gt.ret == 0).all()
    assert len(result.cycles) == 4 * 24
    for c in result.cycles:
        assert c.n_draft == draft and 0 <= c.n_accepted <= draft
        assert c.drafter_kv_max == c.target_kv_max == c.pos + c.n_accepted
    assert position_errors(result) == []
    assert b"drafter decode failed" not in (result.session / "raw.log").read_bytes()
    # Every decode starts where its own context's cache ends (or rewrites a removed range), never past it.
    for row in gt.itertuples():
        kv_max = row.target_kv_max if row.context == "target" else row.drafter_kv_max
        assert kv_max == row.pos_max, row


def test_healthy_acceptance_is_realistic(capture) -> None:
    result = capture(fault="none", spec_type=SIMPLE, draft=2, requests=4, cycles=48)
    assert 0.15 <= result.acceptance <= 0.6
    accepted = {c.n_accepted for c in result.cycles}
    assert {0, 1} <= accepted


def test_dflash_drafter_agrees_with_the_target_part_of_the_time(capture) -> None:
    """The shaped tiny DFlash drafter: its first draft is accepted in about a third of the cycles."""
    result = capture(fault="none", draft=3, requests=4, cycles=48)
    first = sum(1 for c in result.cycles if c.n_accepted >= 1) / len(result.cycles)
    assert 0.25 <= first <= 0.6
    assert 0.08 <= result.acceptance <= 0.5


def test_dflash_cycle_is_upstreams_call_order(capture) -> None:
    """Per cycle: the noise block [id_last, <mask> x k] at n_past, removed; the target's verify batch at n_past;
    the injection of its layer inputs into the drafter at the same positions; both caches trimmed to the accepted
    prefix. The batch dumps show the <mask> rows and the [embd] rows."""
    result = capture(fault="none", draft=3, requests=4, cycles=24)
    gt = truth(result)
    cycles = gt[gt.step != "prompt"].reset_index(drop=True)
    injected_prompts = gt[(gt.step == "inject") & (gt.n_tokens > 4)]
    assert len(injected_prompts) == 4, "each prompt's target batch is injected once"
    cycles = cycles[~cycles.decode.isin(injected_prompts.decode)].reset_index(drop=True)
    assert list(cycles.step[:6]) == ["noise", "verify", "inject"] * 2
    assert len(cycles) == 3 * len(result.cycles)
    for i, c in enumerate(result.cycles):
        noise, verify, inject = (cycles.iloc[3 * i + j] for j in range(3))
        assert noise.context == inject.context == "drafter" and verify.context == "target"
        assert noise.pos_min == verify.pos_min == inject.pos_min == c.pos
        assert noise.n_tokens == verify.n_tokens == inject.n_tokens == 4
        assert noise.drafter_kv_max == c.pos + 3  # the noise block is in the cache right after drafting ...
        assert verify.drafter_kv_max == c.pos - 1  # ... and gone before the target verifies
        assert c.drafter_kv_max == c.target_kv_max == c.pos + c.n_accepted
    text = (result.session / "raw.log").read_text(errors="replace")
    assert re.search(r"\n\S+ D ubatch_print: +\d+: \[embd\], pos = +\d+, n_seq_id = +1, seq_id = \[0\], output = 0\n", text)
    masks = re.findall(r"\n\S+ D ubatch_print: +(\d+): id = +3 \( +<mask>\), pos = +(\d+)", text)
    assert masks and {i for i, _ in masks} == {"1", "2", "3"}
    assert ("I dflash: contract ok: block_size=16 mask_token=3 target_layer_ids=[1] n_target_layers=1 n_embd=64 "
            "n_target_features=64 target_layers=2 cross_ctx=512\n") in text
    assert re.search(r"\n\S+ D  - seq_id 0, draft candidate   0, pos   0: +\d+ \( *[01]\.\d{3}\) '", text)


def test_requests_reset_reuse_and_clear(capture) -> None:
    """Four requests: new prompt, shared-prefix reuse (cache kept), clear (from 0), partial reuse (rewind)."""
    result = capture(fault="none", draft=4, requests=4, cycles=24)
    text = (result.session / "raw.log").read_text(errors="replace")
    cached = [int(n) for n in re.findall(r"cached n_tokens = (\d+), memory_seq_rm \[\1, end\)", text)]
    assert len(cached) == 4
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0 and cached[3] > 0
    starts = [c.pos for c in result.cycles if c.cycle == 0]
    assert starts[1] > starts[0] + 24  # the continued conversation goes on from the cached history
    assert starts[2] < starts[1]  # the cleared one starts again from a short prompt
    assert text.count("stop processing: n_tokens = ") == 4
    assert text.count("draft acceptance = ") == 4 and text.count("statistics           dflash: ") == 4
    injected = truth(result).query("step == 'inject'")
    # every prompt batch of the target is injected into the drafter at the same positions
    prompts = truth(result).query("step == 'prompt'")
    assert set(prompts.pos_min) <= set(injected.pos_min)


# -- faults -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("draft", "drafting"), [(2, "block"), (4, "block"), (16, "block"), (4, "chain")])
def test_stale_drafter_x_stuck_y_climbing(capture, draft: int, drafting: str) -> None:
    result = capture(fault="stale-drafter", spec_type=SIMPLE, draft=draft, drafting=drafting, requests=3, cycles=16)
    gt = truth(result)
    failed = gt[gt.ret != 0]
    errors = position_errors(result)
    assert len(failed) == len(errors) >= 16
    assert (failed.ret == -1).all() and (failed.context == "drafter").all()
    # llama.cpp's X and Y are the drafter's stored max and the batch's first position.
    assert [(x, y) for _, x, y in errors] == list(zip(failed.drafter_kv_max, failed.pos_min, strict=True))
    xs = {x for _, x, _ in errors}
    assert len(xs) == 1  # X stuck for the rest of the run
    ys = [y for _, _, y in errors]
    first_request = [c for c in result.cycles if c.request == 1 and c.draft_ret != 0]
    assert [c.pos for c in first_request] == list(range(first_request[0].pos, first_request[0].pos + 16))
    assert ys[:16] == [c.pos for c in first_request]  # Y climbs by one on every later cycle
    assert ys[0] > xs.pop() + 1  # the seed report's shape: the drafter is behind the target
    # Request 0 ran before any reset: healthy.
    assert all(c.draft_ret == 0 for c in result.cycles if c.request == 0)
    # Each refusal is followed by llama.cpp's own lines and then the fork's drafter line.
    lines = raw_lines(result)
    for line in failed.line:
        i = next(j for j in range(line - 1, len(lines)) if lines[j].endswith(b"Y = X + 1"))
        assert re.fullmatch(rb"\S+ E decode: failed to initialize batch", lines[i + 1])
        assert re.fullmatch(rb"\S+ E llama_decode: failed to decode, ret = -1", lines[i + 2])
        assert re.fullmatch(rb"\S+ E dflash: drafter decode failed with -1", lines[i + 3])


@pytest.mark.parametrize("draft", [2, 3, 8])
def test_stale_dflash_drafter_refuses_its_noise_block_and_injection(capture, draft: int) -> None:
    """After the reset the drafter was neither trimmed nor fed the new prompt: its next noise block and the
    next injection of the target's layer inputs both hit llama.cpp's own Y = X + 1 check, X stuck, Y climbing."""
    result = capture(fault="stale-drafter", draft=draft, requests=3, cycles=16)
    gt = truth(result)
    failed = gt[gt.ret != 0]
    errors = position_errors(result)
    assert len(failed) == len(errors) >= 32
    assert (failed.context == "drafter").all() and (failed.ret == -1).all()
    assert set(failed.step) == {"noise", "inject"}
    assert [(x, y) for _, x, y in errors] == list(zip(failed.drafter_kv_max, failed.pos_min, strict=True))
    first_request = failed[failed.decode < gt[(gt.step == "prompt")].decode.iloc[2]]
    ys = list(first_request.pos_min)
    assert ys[0::2] == ys[1::2] == list(range(ys[0], ys[0] + len(ys) // 2))  # noise, inject at each Y
    assert len({x for _, x, _ in errors}) == 1 and ys[0] > errors[0][1] + 1  # the seed's shape: X < Y - 1
    assert all(c.draft_ret == 0 for c in result.cycles if c.request == 0)
    lines = raw_lines(result)
    for line in failed.line:
        i = next(j for j in range(line - 1, len(lines)) if lines[j].endswith(b"Y = X + 1"))
        assert re.fullmatch(rb"\S+ E decode: failed to initialize batch", lines[i + 1])
        assert re.fullmatch(rb"\S+ E dflash: drafter decode failed with -1", lines[i + 2])


@pytest.mark.parametrize(("spec", "draft", "drafting"), [(DFLASH, 3, "block"), (DFLASH, 8, "block"),
                                                          (EAGLE3, 3, "block"), (SIMPLE, 3, "block"),
                                                          (SIMPLE, 8, "block"), (SIMPLE, 4, "chain")])
def test_no_rollback_leaves_rejected_positions(capture, spec: str, draft: int, drafting: str) -> None:
    result = capture(fault="no-rollback", spec_type=spec, draft=draft, drafting=drafting, requests=2, cycles=24)
    gt = truth(result)
    failed = gt[gt.ret != 0]
    errors = position_errors(result)
    assert len(errors) == len(failed) > 0
    assert (failed.context == "drafter").all() and (failed.ret == -1).all()
    for (_, x, y), row in zip(errors, failed.itertuples(), strict=True):
        assert x >= y  # the rejected draft positions are still in the drafter's cache
        assert (x, y) == (row.drafter_kv_max, row.pos_min)


@pytest.mark.parametrize("draft", [1, 3, 6])
def test_eagle3_follows_upstreams_flow(capture, draft: int) -> None:
    """draft-eagle3: each target batch's three layer inputs are encoded (ENCODE, no KV) into g rows, the pairs
    (token[k + 1], g[k]) go into the drafter at the target's positions, and the draft is a chain of one-token
    decodes from the deferred boundary. Healthy: nothing refused, and after every cycle the drafter is at the
    target's position (or one behind it, the deferred boundary, when every draft was accepted)."""
    result = capture(fault="none", spec_type=EAGLE3, draft=draft, requests=4, cycles=16)
    gt = truth(result)
    assert result.n_failures == 0 and len(result.cycles) == 64
    assert set(gt[gt.context == "drafter"].step) == {"encode", "inject", "draft"}
    assert (gt[gt.step == "draft"].n_tokens == 1).all()
    for c in result.cycles:
        assert c.n_draft == draft
        assert c.target_kv_max == c.pos + c.n_accepted
        assert c.drafter_kv_max == c.target_kv_max - (c.n_accepted == draft)
    verify = gt[gt.step == "verify"]
    inject = gt[gt.step == "inject"]
    assert set(verify.pos_min) <= set(inject.pos_min), "each verify batch's pairs start at its positions"
    for row in gt[gt.step != "encode"].itertuples():  # the encoder writes no KV
        assert (row.target_kv_max if row.context == "target" else row.drafter_kv_max) == row.pos_max, row
    text = (result.session / "raw.log").read_bytes()
    assert b"spec common_specu: adding speculative implementation 'draft-eagle3'" in text
    assert re.search(rb"\n\S+ D spec        draft:  - seq_id 0, draft candidate   0, pos   0: ", text)


def test_stale_eagle3_drafter(capture) -> None:
    """EAGLE3's draft() trims the drafter to its deferred boundary itself, so the stale drafter first fails
    where the target's layer inputs go in, then at every draft: X stuck, Y climbing, on the drafter's side."""
    result = capture(fault="stale-drafter", spec_type=EAGLE3, draft=3, requests=3, cycles=16)
    gt = truth(result)
    failed = gt[gt.ret != 0]
    errors = position_errors(result)
    assert len(failed) == len(errors) >= 16 and (failed.context == "drafter").all()
    assert set(failed.step) == {"inject", "draft"} and failed.step.iloc[0] == "inject"
    assert [(x, y) for _, x, y in errors] == list(zip(failed.drafter_kv_max, failed.pos_min, strict=True))
    assert len({x for _, x, _ in errors[:16]}) == 1 and errors[0][2] > errors[0][1] + 1
    text = (result.session / "raw.log").read_bytes()
    assert re.search(rb"\n\S+ E spec      process: llama_process\(ctx_dft\) failed rc=-1 \(n_tokens=\d+, "
                     rb"ubatch_pos\[0\]=\d+\)\n", text)  # fmt: skip
    assert re.search(rb"\n\S+ E spec        draft: llama_process returned -1\n", text)


def test_ground_truth_table(capture) -> None:
    result = capture(fault="stale-drafter", draft=4, requests=3, cycles=16)
    gt = truth(result)
    assert tuple(gt.columns) == GROUND_TRUTH_COLUMNS
    assert set(gt.step) == {"prompt", "verify", "inject", "noise"}
    assert set(gt[gt.context == "target"].step) == {"prompt", "verify"}
    assert list(gt.decode) == list(range(len(gt)))
    assert set(gt.context) == {"target", "drafter"}
    assert (gt.seq_id == 0).all()
    assert (gt.pos_max - gt.pos_min + 1 == gt.n_tokens).all()
    assert gt.line.is_monotonic_increasing
    lines = raw_lines(result)
    # With LLAMA_BATCH_DEBUG=1 every decode's output begins with the input batch dump.
    for row in gt.itertuples():
        assert lines[row.line - 1].endswith(b"D init: input batch info:"), row
        assert f"n_tokens     = {row.n_tokens}".encode() in lines[row.line + 1]


def test_manifest(capture, cache: Path) -> None:
    result = capture(fault="stale-drafter", draft=4, requests=3, cycles=16)
    manifest = json.loads((result.session / "manifest.json").read_text())
    gt = truth(result)
    pair = ensure_models(cache, seed=0)
    assert manifest["kind"] == "engine"
    assert manifest["engine"]["fault"] == "stale-drafter" and manifest["engine"]["draft"] == 4
    assert manifest["models"]["target"]["sha256"] == sha256_file(pair.target)
    assert manifest["models"]["drafter"]["sha256"] == sha256_file(ensure_upstream_drafter("dflash", cache, seed=0))
    assert manifest["engine"]["spec_type"] == "draft-dflash"
    assert pair.drafter.name == "drafter.gguf"  # the plain llama drafter stays for draft-simple
    assert manifest["versions"]["llama_cpp_python"] == "0.3.36"
    assert manifest["device"]["ran_on"] == ["CPU"]
    assert manifest["outcome"]["status"] == "ok"
    assert manifest["outcome"]["decodes"] == len(gt)
    assert manifest["outcome"]["failures"] == int((gt.ret != 0).sum())
    assert manifest["outcome"]["log_levels"]["debug"] > 0  # batch dumps need DEBUG through the callback
    assert manifest["started"] <= manifest["ended"]


# -- log shape ----------------------------------------------------------------------------------------


def test_prefix_on_first_line_of_each_entry_only(capture) -> None:
    result = capture(fault="stale-drafter", draft=4, requests=3, cycles=16)
    lines = [ln for ln in raw_lines(result) if ln]
    assert sum(1 for ln in lines if PREFIX.match(ln)) > 0.95 * len(lines)
    continuation = [ln for ln in lines if ln.startswith(b" - the last position stored")]
    assert continuation and all(not PREFIX.match(ln) for ln in continuation)
    assert any(re.match(rb"^\S+ E init: the tokens of sequence 0", ln) for ln in lines)
    accepted = rb"^\S+ D slot update_slots: id  0 \| task 0 \| accepted \d+/4 draft tokens, new n_tokens = \d+$"
    assert any(re.match(accepted, ln) for ln in lines)
    timing = rb"^\S+ I slot print_timing: id  0 \| task \d+ \| draft acceptance = "
    assert any(re.match(timing, ln) for ln in lines)


def test_no_prefix_old_scheme_wording(capture) -> None:
    result = capture(fault="no-rollback", draft=3, requests=2, cycles=24, log_prefix=False, flavor="fork-v0.2")
    lines = raw_lines(result)
    assert not any(PREFIX.match(ln) for ln in lines)
    assert b"init: input batch info:" in lines
    assert b"dflash: drafter decode failed with -1" in lines
    text = b"\n".join(lines)
    assert re.search(rb"\nslot update_slots: id  0 \| task 1 \| n_tokens = (\d+), memory_seq_rm \[\1, end\)\n", text)
    assert re.search(rb"\nslot print_timing: id  0 \| task 0 \| \nprompt eval time = ", text)
    assert re.search(rb"\ndraft acceptance rate = 0\.\d{5} \( +\d+ accepted / +\d+ generated\)\n", text)


def test_upstream_wording(capture) -> None:
    """Upstream's DFlash: the refused noise block is a warning from draft(), the refused injection an error
    from process() after which the server logs `failed to process speculative batch` and the request ends."""
    result = capture(fault="stale-drafter", draft=4, requests=3, cycles=8, flavor="upstream")
    text = (result.session / "raw.log").read_bytes()
    assert len(re.findall(rb"\n\S+ W draft: llama_process returned -1\n", text)) == 2
    refused = re.findall(
        rb"\n\S+ E process: llama_process\(ctx_dft\) failed rc=-1 \(n_tokens=1, offset=0\)\n"
        rb"\S+ E srv        decode: failed to process speculative batch\n", text)  # fmt: skip
    assert len(refused) == 2 and truth(result).ret.ne(0).sum() == 4
    assert b"common_speculative_impl_draft_dflash: adding speculative implementation 'draft-dflash'" in text
    assert b"dflash: drafter decode failed" not in text and b"dflash: contract" not in text
    assert re.search(rb"\n\S+ I slot   operator\(\): id  0 \| task 0 \| new prompt, n_ctx_slot = 8192, ", text)
    assert re.search(rb"draft acceptance = 0\.\d{5} \( +\d+ accepted / +\d+ generated\), mean len = +\d\.\d\d\n", text)


def test_upstream_wording_draft_simple(capture) -> None:
    result = capture(fault="stale-drafter", spec_type=SIMPLE, draft=4, requests=2, cycles=8, flavor="upstream")
    text = (result.session / "raw.log").read_bytes()
    assert len(re.findall(rb"\n\S+ W draft: llama_decode returned -1\n", text)) == 8
    assert b"dflash: drafter decode failed" not in text
    assert re.search(rb"\n\S+ I slot   operator\(\): id  0 \| task 0 \| new prompt, n_ctx_slot = 8192, ", text)
    assert re.search(rb"draft acceptance = 0\.\d{5} \( +\d+ accepted / +\d+ generated\), mean len = +\d\.\d\d\n", text)


def test_kv_debug_can_be_switched_off(capture) -> None:
    before = os.environ.get("LLAMA_KV_CACHE_DEBUG")
    off = capture(fault="none", draft=4, requests=2, cycles=8, kv_debug=False)
    on = capture(fault="none", draft=4, requests=2, cycles=8)
    assert b"find_slot:" not in (off.session / "raw.log").read_bytes()
    text = (on.session / "raw.log").read_bytes()
    # The two caches differ in size, which is how a reader can tell them apart.
    assert b"size =  8192" in text and b"size =  4096" in text
    assert os.environ.get("LLAMA_KV_CACHE_DEBUG") == before  # the process environment is restored
    assert truth(off)[["context", "n_tokens", "pos_min"]].equals(truth(on)[["context", "n_tokens", "pos_min"]])


def test_deterministic(capture, cache: Path, tmp_path: Path) -> None:
    first = capture(fault="no-rollback", draft=3, requests=2, cycles=24)
    again = run_engine(
        EngineConfig(cache_dir=cache, fault="no-rollback", draft=3, requests=2, cycles=24), Session(tmp_path)
    )
    assert truth(first).equals(truth(again))


def test_thousand_cycles(cache: Path, tmp_path: Path) -> None:
    result = run_engine(EngineConfig(cache_dir=cache, fault="stale-drafter", requests=4, cycles=250), Session(tmp_path))
    assert len(result.cycles) == 1000
    assert result.n_failures == len(position_errors(result)) > 500
    assert len(truth(result)) == result.n_decodes


def test_bad_settings_are_one_line_errors(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="at least 2 requests"):
        run_engine(EngineConfig(cache_dir=cache, fault="stale-drafter", requests=1), Session(tmp_path))
    with pytest.raises(EngineError, match="unknown fault"):
        run_engine(EngineConfig(cache_dir=cache, fault="oops"), Session(tmp_path))
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"nope")
    with pytest.raises(EngineError, match="not a GGUF file"):
        run_engine(EngineConfig(target=bogus, drafter=bogus), Session(tmp_path))
    with pytest.raises(EngineError, match="unknown spec type"):
        run_engine(EngineConfig(cache_dir=cache, spec_type="draft-mtp"), Session(tmp_path))


def test_bad_drafters_are_one_line_errors_before_loading(cache: Path, tmp_path: Path) -> None:
    """What llama.cpp would abort on (a target layer id at n_layer) or get wrong is refused before it loads."""
    pair = ensure_models(cache, seed=0)
    dflash = ensure_upstream_drafter("dflash", cache, seed=0)
    too_deep = tmp_path / "deep.gguf"  # dflash.target_layers [2] for a 2-layer target
    _write_upstream_drafter(too_deep, "dflash", ModelParams(target_layers=3), 0)
    narrow = tmp_path / "narrow.gguf"
    _write_upstream_drafter(narrow, "dflash", ModelParams(n_embd=32), 0)
    cases = [
        (too_deep, DFLASH, r"target_layers \[2\] reach the target's n_layer = 2"),
        (narrow, DFLASH, r"widths differ \(n_embd 64 vs 32\)"),
        (pair.drafter, DFLASH, "needs a dflash drafter; drafter.gguf is llama"),
        (dflash, SIMPLE, "is a dflash model: use --spec-type draft-dflash"),
        (dflash, EAGLE3, "needs an eagle3 drafter; dflash-v2.gguf is dflash"),
    ]
    for drafter, spec, message in cases:
        session = Session(tmp_path / drafter.stem / spec)
        with pytest.raises(EngineError, match=message) as err:
            run_engine(EngineConfig(target=pair.target, drafter=drafter, spec_type=spec), session)
        assert "\n" not in str(err.value)
        assert not session.raw_log.exists(), "nothing ran"


def test_real_gguf_paths(cache: Path, tmp_path: Path) -> None:
    pair = ensure_models(cache, seed=0)
    result = run_engine(
        EngineConfig(target=pair.target, drafter=pair.drafter, spec_type=SIMPLE, fault="none", requests=2, cycles=8),
        Session(tmp_path),
    )
    assert result.n_failures == 0 and len(result.cycles) == 16
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["models"]["target"]["path"] == str(pair.target)
    # --drafter FILE with a dflash model: the real DFlash flow on the user's files
    dflash = ensure_upstream_drafter("dflash", cache, seed=0)
    (tmp_path / "d").mkdir()
    result = run_engine(EngineConfig(target=pair.target, drafter=dflash, requests=2, cycles=8), Session(tmp_path / "d"))
    assert result.n_failures == 0 and len(result.cycles) == 16
    assert {"inject", "noise"} <= set(truth(result).step)


# -- CLI ----------------------------------------------------------------------------------------------


def test_cli_engine_json_and_exit_codes(cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KVTRACE_CACHE": str(cache)}
    done = run_kvtrace(
        "capture", "engine", "--fault", "no-rollback", "--draft", "3", "--out", "s1", "--json",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["failures"] > 0 and summary["fault"] == "no-rollback"
    assert (tmp_path / "s1" / "raw.log").is_file() and (tmp_path / "s1" / "ground_truth.parquet").is_file()
    bad = run_kvtrace("capture", "engine", "--target", "nowhere.gguf", "--out", "s2", cwd=tmp_path, env=env)
    assert bad.returncode == 2
    assert bad.stderr.decode().count("\n") == 1 and b"Traceback" not in bad.stderr
    assert not (tmp_path / "s2").exists()
    pair = ensure_models(cache, seed=0)
    wrong = run_kvtrace("capture", "engine", "--target", str(pair.target), "--drafter", str(pair.drafter),
                        "--out", "s3", cwd=tmp_path, env=env)  # a llama drafter for the default draft-dflash
    assert wrong.returncode == 2 and not (tmp_path / "s3").exists()
    assert wrong.stderr.decode() == "kvtrace: --spec-type draft-dflash needs a dflash drafter; drafter.gguf is llama\n"
    eagle = run_kvtrace("capture", "engine", "--spec-type", "draft-eagle3", "--fault", "stale-drafter", "--requests",
                        "2", "--cycles", "8", "--out", "s4", "--json", cwd=tmp_path, env=env)  # fmt: skip
    assert eagle.returncode == 0, eagle.stderr
    assert json.loads(eagle.stdout)["failures"] > 0
    assert json.loads((tmp_path / "s4" / "manifest.json").read_text())["engine"]["spec_type"] == "draft-eagle3"


def test_demo_prints_the_triage(cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KVTRACE_CACHE": str(cache)}
    done = run_kvtrace("demo", "--no-dashboard", "--out", "demo", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert re.search(r"verdict: +inconsistent_positions \(drafter, decided by line \d+\)", out), out
    gt = pd.read_parquet(tmp_path / "demo" / "ground_truth.parquet")
    first = gt[gt.ret != 0].iloc[0]
    assert f"X = {first.drafter_kv_max}   Y = {first.pos_min}" in out


def test_demo_opens_the_dashboard_on_localhost(cache: Path, tmp_path: Path) -> None:
    import signal

    import httpx

    port = free_port()
    env = {**os.environ, "KVTRACE_CACHE": str(cache)}
    proc = start_kvtrace("demo", "--out", "demo", "--port", str(port), cwd=tmp_path, env=env)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout=90, what="the dashboard")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # never left running (its dashboard dies with it)
            proc.communicate()
            raise
    assert proc.returncode == 0
    assert f"kvtrace dashboard: {url}" in out.decode()
    assert re.search(r"verdict: +inconsistent_positions \(drafter, decided by line \d+\)", out.decode())


def test_samples_are_current(tmp_path: Path) -> None:
    """`make samples` regenerates exactly what is committed (ground truth compared, timings aside)."""
    from tools.samples import DEFAULT_DIR, write_samples

    write_samples(tmp_path)
    for name in ("healthy", "stale-drafter", "no-rollback"):
        fresh = pd.read_parquet(tmp_path / name / "ground_truth.parquet")
        committed = pd.read_parquet(DEFAULT_DIR / name / "ground_truth.parquet")
        assert fresh.equals(committed), name
        text = (DEFAULT_DIR / name / "raw.log").read_bytes()
        assert b"/" not in b"".join(ln for ln in text.split(b"\n") if b"llama_model_loader: loaded meta" in ln)
    stale = pd.read_parquet(DEFAULT_DIR / "stale-drafter" / "ground_truth.parquet")
    assert (stale.ret == -1).any() and (
        pd.read_parquet(DEFAULT_DIR / "healthy" / "ground_truth.parquet").ret == 0
    ).all()


def test_pace_writes_the_log_cycle_by_cycle(cache: Path, tmp_path: Path) -> None:
    """--pace: each cycle's lines reach raw.log before the pause, so a live reader sees the capture grow."""
    import threading
    import time

    cfg = EngineConfig(cache_dir=cache, fault="stale-drafter", requests=2, cycles=6, pace_s=0.15)
    done: list[EngineResult] = []
    worker = threading.Thread(target=lambda: done.append(run_engine(cfg, Session(tmp_path))))
    worker.start()
    sizes = set()
    while worker.is_alive():
        raw = tmp_path / "raw.log"
        if raw.exists():
            sizes.add(raw.stat().st_size)
        time.sleep(0.03)
    worker.join()
    assert done and done[0].duration_s >= len(done[0].cycles) * 0.15
    assert len({s for s in sizes if 0 < s < (tmp_path / "raw.log").stat().st_size}) >= 4, sizes
    assert json.loads((tmp_path / "manifest.json").read_text())["engine"]["pace_s"] == 0.15
    with pytest.raises(EngineError, match="--pace"):
        run_engine(EngineConfig(cache_dir=cache, pace_s=-1), Session(tmp_path))
