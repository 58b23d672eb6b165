"""The generated tiny model pair: deterministic, small, loadable by real llama.cpp, one shared vocabulary."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from kvtrace.capture.models import (
    BOS_ID,
    CHAT_TEMPLATE,
    MASK_ID,
    ModelError,
    ModelPair,
    ensure_models,
    generate_pair,
    resolve_models,
    sha256_file,
    vocabulary,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ModelPair:
    return ensure_models(tmp_path_factory.mktemp("models"), seed=0)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = generate_pair(tmp_path / "a", seed=7)
    b = generate_pair(tmp_path / "b", seed=7)
    c = generate_pair(tmp_path / "c", seed=8)
    assert sha256_file(a.target) == sha256_file(b.target)
    assert sha256_file(a.drafter) == sha256_file(b.drafter)
    assert sha256_file(a.target) != sha256_file(c.target)
    assert sha256_file(a.target) != sha256_file(a.drafter)


def test_small_files(pair: ModelPair) -> None:
    assert pair.target.stat().st_size < 800_000
    assert pair.drafter.stat().st_size < pair.target.stat().st_size


def test_made_once_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTRACE_CACHE", str(tmp_path / "cache"))
    first = ensure_models(seed=3)
    assert first.target.parent.parent == tmp_path / "cache"
    stamp = first.target.stat().st_mtime_ns
    again = ensure_models(seed=3)
    assert again == first
    assert again.target.stat().st_mtime_ns == stamp
    assert ensure_models(seed=4).target.parent != first.target.parent


def test_vocabulary_is_unique_with_byte_tokens() -> None:
    from gguf import TokenType

    tokens, scores, types = vocabulary()
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types)
    byte_ids = [i for i, t in enumerate(types) if t == TokenType.BYTE]
    assert [tokens[i] for i in byte_ids] == [f"<0x{b:02X}>" for b in range(256)]
    assert tokens[BOS_ID] == "<s>" and tokens[MASK_ID] == "<mask>"


def test_metadata_read_back(pair: ModelPair) -> None:
    from gguf import GGUFReader

    for path, layers in ((pair.target, 2), (pair.drafter, 1)):
        fields = GGUFReader(path).fields
        arch = fields["general.architecture"]
        assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
        assert int(fields["llama.block_count"].parts[-1][0]) == layers
        tmpl = fields["tokenizer.chat_template"]
        assert bytes(tmpl.parts[tmpl.data[0]]).decode() == CHAT_TEMPLATE


def test_both_load_in_llama_cpp_with_one_vocabulary(pair: ModelPair) -> None:
    import llama_cpp as L

    from kvtrace.capture.engine.llama_log import LlamaLogCapture, LogWriter

    # Route llama.cpp's chatter into a file so the test output stays readable.
    writer = LogWriter(pair.target.parent / "load.log", prefix=False)
    with LlamaLogCapture(writer):
        vocabs = []
        models = []
        for path in (pair.target, pair.drafter):
            params = L.llama_model_default_params()
            model = L.llama_model_load_from_file(str(path).encode(), params)
            assert model, f"llama.cpp refused {path.name}"
            models.append(model)
            vocabs.append(L.llama_model_get_vocab(model))
        n = [L.llama_vocab_n_tokens(v) for v in vocabs]
        assert n[0] == n[1] == len(vocabulary()[0])
        text = b"the cache, (draft)\nslot"
        buf = (L.llama_token * 64)()
        count = L.llama_tokenize(vocabs[0], text, len(text), buf, 64, True, False)
        ids = list(buf[:count])
        assert ids[0] == BOS_ID
        pieces = b""
        for tok in ids[1:]:
            out = ctypes.create_string_buffer(32)
            size = L.llama_token_to_piece(vocabs[0], tok, out, 32, 0, False)
            pieces += out.raw[:size]
        # Byte tokens detokenize to the byte itself (type 6), so the newline survives.
        assert pieces.strip() == text
        for model in models:
            L.llama_model_free(model)
    writer.close()


def test_real_paths_checked(tmp_path: Path, pair: ModelPair) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a model")
    with pytest.raises(ModelError, match="not a GGUF file"):
        ModelPair.from_paths(bogus, pair.drafter)
    with pytest.raises(ModelError, match="both --target and --drafter"):
        resolve_models(pair.target, None)
    with pytest.raises(ModelError, match="drafter model"):
        ModelPair.from_paths(pair.target, tmp_path / "missing.gguf")
    real = resolve_models(pair.target, pair.drafter)
    assert (real.target, real.drafter, real.generated) == (pair.target, pair.drafter, False)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_upstream_drafters_are_deterministic_cached_and_carry_their_keys(kind: str, tmp_path: Path) -> None:
    import gguf

    from kvtrace.capture.models import ensure_upstream_drafter, sha256_file

    a = ensure_upstream_drafter(kind, tmp_path / "a")
    b = ensure_upstream_drafter(kind, tmp_path / "b")
    assert sha256_file(a) == sha256_file(b)  # the same bytes from the same seed
    mtime = a.stat().st_mtime_ns
    assert ensure_upstream_drafter(kind, tmp_path / "a") == a and a.stat().st_mtime_ns == mtime  # cached
    reader = gguf.GGUFReader(str(a))
    fields = reader.fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    assert arch == kind
    layers = [int(fields[f"{kind}.target_layers"].parts[i][0]) for i in fields[f"{kind}.target_layers"].data]
    assert layers and max(layers) < 2  # ids must be below the tiny target's n_layer, or the server aborts
    assert int(fields["tokenizer.ggml.mask_token_id"].parts[-1][0]) == 3
    names = {t.name for t in reader.tensors}
    assert "fc.weight" in names and "token_embd.weight" not in names  # the target's embeddings are shared
    with pytest.raises(Exception, match="unknown drafter kind"):
        ensure_upstream_drafter("mtp", tmp_path / "a")
