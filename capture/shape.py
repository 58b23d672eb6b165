"""A recording's shape (`kvtrace redact`): the same requests with every text replaced by made-up text of the
same token count, for a maintainer to replay without ever seeing the user's words.

What stays: which requests share which prefix (a text is replaced word by word, each made-up word chosen from
the original tokens up to it, so two texts that begin alike still begin alike, and the same text is always the
same made-up text), the tool-call structure (names and argument keys become made-up identifiers, the same
everywhere), sampling parameters, timing, cancels. An assistant message that sends back an earlier answer is
linked to that request, so the replay sends back what its own server answered, and the cache is reused as it
was then; each answer is made as long as it was (`max_tokens` and `ignore_eos`). Dropped: what constrains the
answer's words (stop strings, grammars, JSON schemas: the answer's length is set instead), images and audio,
and bodies that are not JSON.

Counting tokens needs the model's own tokenizer: llama.cpp's `llama-tokenize` (beside the server that made the
recording, or any build) with the session's model file. The made-up words are the model's own whole-word tokens.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtrace.capture.recording import Answer, RecordedRequest, text_digest

# Top-level fields kept as they are: sampling, lengths, switches; no text of the user's in them.
KEPT_FIELDS = frozenset({
    "model", "stream", "stream_options", "temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "n",
    "max_tokens", "max_completion_tokens", "n_predict", "n_keep", "n_probs", "logprobs", "top_logprobs",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau",
    "mirostat_eta", "dynatemp_range", "dynatemp_exponent", "top_n_sigma", "samplers", "cache_prompt", "id_slot",
    "ignore_eos", "parallel_tool_calls", "tool_choice", "reasoning_format", "chat_template_kwargs", "t_max_predict_ms",
    "timings_per_token", "return_tokens", "post_sampling_probs", "add_generation_prompt", "enable_thinking",
    "reasoning_budget", "with_pieces", "add_special", "speculative.n_max", "speculative.n_min", "speculative.p_min",
})
# Fields that decide the answer's words: dropped, the answer's length is set instead (answer_tokens).
DROPPED_FIELDS = frozenset({"stop", "grammar", "json_schema", "response_format", "logit_bias", "grammar_lazy",
                            "grammar_triggers", "preserved_tokens", "lora"})
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
_WORD = re.compile(r"^[a-z]{2,12}$")
# whole-word markers: sentencepiece's and GPT-2 byte-level BPE's
_MARKERS = ("\u2581", "\u0120")


class ShapeError(Exception):
    """A shape cannot be made (no tokenizer, no model file): one line that says what to give."""


# ---- the model's tokenizer ------------------------------------------------------------------------------

class Tokenizer:
    """llama.cpp's own tokenizer for one model file, through its `llama-tokenize` program (the vocabulary only
    is loaded); each distinct text is tokenized once."""

    def __init__(self, program: Path, model: Path) -> None:
        self.program, self.model = Path(program), Path(model)
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        if not text:
            return []
        if text not in self._cache:
            argv = [str(self.program), "-m", str(self.model), "--stdin", "--ids", "--log-disable", "--no-bos"]
            try:
                proc = subprocess.run(argv, input=text.encode(), capture_output=True, timeout=120, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ShapeError(f"{self.program.name} could not run: {exc}") from None
            last = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            try:
                ids = json.loads(last[0])
            except ValueError:
                ids = None
            if proc.returncode != 0 or not isinstance(ids, list):
                why = " ".join(proc.stderr.decode("utf-8", "replace").split())[-200:]
                raise ShapeError(f"{self.program.name} could not tokenize with {self.model.name}: {why or 'no ids'}")
            self._cache[text] = [int(i) for i in ids]
        return self._cache[text]

    def count(self, text: str) -> int:
        return len(self.ids(text))


def vocabulary_words(model: Path) -> tuple[list[str], list[int]]:
    """The model's whole-word tokens that are plain lowercase words (`▁water`, `Ġwater`): the made-up text's
    words, and their token ids."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(model))
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    except (OSError, ValueError, KeyError) as exc:
        raise ShapeError(f"{model}: no tokenizer vocabulary in it ({type(exc).__name__}): is it a GGUF "
                         "model?") from None
    words, ids = [], []
    for i, tok in enumerate(tokens):
        if isinstance(tok, str) and tok[:1] in _MARKERS and _WORD.match(tok[1:]):
            words.append(tok[1:])
            ids.append(i)
    return words, ids


def find_tokenizer(manifest: dict[str, Any], model: Path | None = None, program: Path | None = None) -> Tokenizer:
    """The session's model (or `model`) and a `llama-tokenize` (or `program`): beside the program that ran, then
    beside the llama-server kvtrace finds, then on PATH."""
    flags = manifest.get("triage_flags")
    named = flags.get("model") if isinstance(flags, dict) else None
    chosen = model or (Path(str(named)) if named else None)
    if chosen is None or not chosen.is_file():
        said = f" (the session's server loaded {chosen})" if chosen is not None else ""
        raise ShapeError(f"the shape needs the model's tokenizer: give --model FILE.gguf{said}")
    if program is not None:
        if not (program.is_file() and os.access(program, os.X_OK)):
            raise ShapeError(f"--tokenizer {program}: not an executable file")
        return Tokenizer(program, chosen)
    for where in _tokenizer_places(manifest):
        if where is not None and where.is_file() and os.access(where, os.X_OK):
            return Tokenizer(where, chosen)
    raise ShapeError("the shape needs llama.cpp's llama-tokenize (any build): give --tokenizer PATH")


def _tokenizer_places(manifest: dict[str, Any]) -> Iterable[Path | None]:
    name = "llama-tokenize"
    command = manifest.get("command")
    if isinstance(command, list) and command:
        ran = shutil.which(str(command[0]))
        yield Path(ran).with_name(name) if ran else None
    from kvtrace.capture.llama_server import find_llama_server

    server = find_llama_server()
    yield server.with_name(name) if server is not None else None
    found = shutil.which(name)
    yield Path(found) if found else None


# ---- made-up text -----------------------------------------------------------------------------------------

class Shaper:
    """Made-up text of the same token count. Word i is chosen by a keyed hash of the original tokens 0..i, so a
    shared beginning stays shared and nothing of the words is kept; the key is random for each shape and never
    written down."""

    def __init__(self, tokenizer: Tokenizer, words: list[str], key: bytes | None = None) -> None:
        if len(words) < 16:
            raise ShapeError(f"{tokenizer.model.name} has too few whole-word tokens ({len(words)}) for made-up text")
        self.tokenizer = tokenizer
        self.words = words
        self.key = key if key is not None else os.urandom(32)
        self._texts: dict[tuple[str, str], str] = {}
        self.texts = 0
        self.tokens = 0

    def _chain(self, ids: list[int], n: int) -> list[str]:
        out, h = [], hashlib.blake2b(key=self.key, digest_size=16).digest()
        for i in range(n):
            tok = ids[i] if i < len(ids) else -1 - i  # past the original's end (an adjustment): still fixed
            h = hashlib.blake2b(h + tok.to_bytes(8, "little", signed=True), key=self.key, digest_size=16).digest()
            out.append(self.words[int.from_bytes(h[:8], "little") % len(self.words)])
        return out

    def text(self, original: str, joiner: str = " ") -> str:
        """`original`'s made-up twin: as many tokens (checked with the tokenizer, and mended at its end)."""
        if not original.strip():
            return original
        cached = self._texts.get((original, joiner))
        if cached is not None:
            return cached
        ids = self.tokenizer.ids(original)
        n = len(ids)
        words = self._chain(ids, n)
        made = joiner.join(words)
        for _ in range(4):  # a word that tokenizes otherwise next to its neighbours: trim or add at the end
            got = self.tokenizer.count(made)
            if got == n or not words:
                break
            if got > n:
                words = words[: max(1, len(words) - (got - n))]
            else:
                words = words + self._chain(ids, len(words) + n - got)[len(words):]
            made = joiner.join(words)
        self._texts[(original, joiner)] = made
        self.texts += 1
        self.tokens += n
        return made

    def ident(self, name: str) -> str:
        """A made-up identifier (a tool's, an argument's, a call's id) of as many tokens where templates put it:
        quoted inside JSON (the tools' list, a call's arguments). The same wherever `name` appears."""
        return self._quoted(name, "_")

    def quoted(self, original: str) -> str:
        """Made-up text of as many tokens as `original` has as a JSON string (a description, an argument's value):
        templates render these inside JSON (tojson), where a vocabulary splits words otherwise."""
        return self._quoted(original, " ")

    def _quoted(self, original: str, joiner: str) -> str:
        if not original.strip():
            return original
        cached = self._texts.get((original, "json" + joiner))
        if cached is not None:
            return cached
        n = self.tokenizer.count(_json_string(original))
        ids = self.tokenizer.ids(original)
        pool = joiner.join(self._chain(ids, max(n, 2)))
        while self.tokenizer.count(_json_string(pool)) < n:  # a vocabulary of long words: more of them
            pool = joiner.join(self._chain(ids, 2 * len(pool.split(joiner))))
        # the shortest prefix of the made-up words with as many tokens (the count grows with the prefix); a
        # prefix ending inside a word is fine, the words are made up
        lo, hi = 1, len(pool)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tokenizer.count(_json_string(pool[:mid].rstrip(joiner) or pool[:1])) < n:
                lo = mid + 1
            else:
                hi = mid
        made = pool[:lo].rstrip(joiner) or pool[:1]
        if self.tokenizer.count(_json_string(made)) != n:  # the count jumped by two there: near cuts, then others
            near = [pool[:cut] for cut in range(max(1, lo - 3), min(len(pool), lo + 4))]
            later = [pool[start:start + cut] for start in range(1, 6) for cut in range(max(1, lo - 2), lo + 3)]
            made = next((c for c in near + later if c.strip(joiner) == c and c
                         and self.tokenizer.count(_json_string(c)) == n), made)
        self._texts[(original, "json" + joiner)] = made
        self.texts += 1
        self.tokens += n
        return made


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ---- the shape of one request --------------------------------------------------------------------------------

@dataclass(slots=True)
class ShapeSummary:
    requests: int = 0
    texts: int = 0
    tokens: int = 0
    linked_answers: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, what: str) -> None:
        self.dropped[what] = self.dropped.get(what, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "texts": self.texts, "tokens": self.tokens,
                "linked_answers": self.linked_answers, "dropped": dict(sorted(self.dropped.items()))}


def _schema(node: Any, s: Shaper) -> Any:
    """A JSON schema (a tool's parameters) with its names and descriptions made up, its structure kept."""
    if isinstance(node, list):
        return [_schema(v, s) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "properties" and isinstance(v, dict):
            out[k] = {s.ident(name): _schema(sub, s) for name, sub in v.items()}
        elif k == "required" and isinstance(v, list):
            out[k] = [s.ident(x) if isinstance(x, str) else x for x in v]
        elif k in ("description", "title") and isinstance(v, str):
            out[k] = s.quoted(v)
        elif k in ("enum", "examples", "default", "const"):
            out[k] = _values(v, s)
        else:
            out[k] = _schema(v, s)
    return out


def _values(node: Any, s: Shaper, inner: bool = True) -> Any:
    """Any JSON value with every string made up and every key a made-up identifier; `inner`: a value inside
    JSON the template renders as JSON (its strings counted quoted), else a body's own field (a prompt)."""
    if isinstance(node, str):
        return s.quoted(node) if inner else s.text(node)
    if isinstance(node, list):
        return [_values(v, s, inner) for v in node]
    if isinstance(node, dict):
        return {s.ident(str(k)): _values(v, s, inner) for k, v in node.items()}
    return node


def _arguments(text: str, s: Shaper) -> str:
    """A tool call's arguments (a JSON text): keys as the tool's schema has them, values made up."""
    try:
        value = json.loads(text)
    except ValueError:
        return s.quoted(text)
    return json.dumps(_values(value, s), ensure_ascii=False)


def _tool_call(call: Any, s: Shaper) -> Any:
    if not isinstance(call, dict):
        return _values(call, s)
    out = dict(call)
    if isinstance(call.get("id"), str):
        out["id"] = s.ident(call["id"])
    fn = call.get("function")
    if isinstance(fn, dict):
        out["function"] = {**fn, **({"name": s.ident(fn["name"])} if isinstance(fn.get("name"), str) else {}),
                           **({"arguments": _arguments(fn["arguments"], s)} if isinstance(fn.get("arguments"), str)
                              else {})}
    return out


def _content(content: Any, s: Shaper, summary: ShapeSummary) -> Any:
    made = s.text
    if isinstance(content, str):
        return made(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append({**part, "text": made(part["text"])})
            else:
                summary.drop(f"content part {part.get('type') if isinstance(part, dict) else type(part).__name__}")
        return parts
    return _values(content, s)


def _message(msg: Any, s: Shaper, summary: ShapeSummary) -> Any:
    if not isinstance(msg, dict):
        return _values(msg, s)
    out: dict[str, Any] = {}
    for k, v in msg.items():
        if k == "role":
            out[k] = v
        elif k in ("content", "reasoning_content"):
            out[k] = _content(v, s, summary)  # a tool's result too: templates put it in as text
        elif k == "tool_calls" and isinstance(v, list):
            out[k] = [_tool_call(c, s) for c in v]
        elif k in ("name", "tool_call_id") and isinstance(v, str):
            out[k] = s.ident(v)
        else:
            out[k] = _values(v, s)
    return out


def _tool(tool: Any, s: Shaper) -> Any:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        return _values(tool, s)
    fn = tool["function"]
    shaped = {k: v for k, v in fn.items() if k not in ("name", "description", "parameters")}
    if isinstance(fn.get("name"), str):
        shaped["name"] = s.ident(fn["name"])
    if isinstance(fn.get("description"), str):
        shaped["description"] = s.quoted(fn["description"])
    if "parameters" in fn:
        shaped["parameters"] = _schema(fn["parameters"], s)
    return {**tool, "function": shaped}


def shape_body(body: Any, s: Shaper, summary: ShapeSummary) -> Any:
    """A request body with its texts made up and what decides the answer's words dropped."""
    if not isinstance(body, dict):
        return _values(body, s)
    out: dict[str, Any] = {}
    for k, v in body.items():
        if k in DROPPED_FIELDS:
            summary.drop(k)
        elif k in KEPT_FIELDS:
            out[k] = copy.deepcopy(v)
        elif k == "messages" and isinstance(v, list):
            out[k] = [_message(m, s, summary) for m in v]
        elif k == "tools" and isinstance(v, list):
            out[k] = [_tool(t, s) for t in v]
        else:
            out[k] = _values(v, s, inner=False)  # prompt, input, content, and anything not known: made up
    return out


def _answer_links(rec: RecordedRequest, answered: dict[str, int], s: Shaper) -> list[list[int]]:
    """[message index, request id, tokens] for each assistant message that sends back an earlier request's
    answer: the replay sends back its own answer there when it has as many tokens (the prompt keeps its length),
    else the made-up text."""
    body = rec.body if isinstance(rec.body, dict) else {}
    links = []
    for i, msg in enumerate(body.get("messages") or []):
        if isinstance(msg, dict) and msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
            for text in (msg["content"], msg["content"].strip()):
                k = answered.get(text_digest(text))
                if k is not None and k != rec.id:
                    links.append([i, k, s.tokenizer.count(msg["content"])])
                    break
    return links


def shape_records(records: list[RecordedRequest], s: Shaper) -> tuple[list[RecordedRequest], ShapeSummary]:
    """The shape of a whole recording, in its order."""
    summary = ShapeSummary()
    answered: dict[str, int] = {}  # answer digest -> the first request that got it
    out = []
    for rec in sorted(records, key=lambda r: (r.start, r.id)):
        links = _answer_links(rec, answered, s)
        summary.linked_answers += len(links)
        predicted = (rec.timings or {}).get("predicted_n")
        shape: dict[str, Any] = {"links": links}
        if isinstance(predicted, int) and not isinstance(predicted, bool) and predicted > 0:
            shape["answer_tokens"] = predicted
        if rec.body_b64 is not None:
            summary.drop("body that is not JSON")
        out.append(replace(rec, body=shape_body(rec.body, s, summary) if rec.body is not None else None,
                           body_b64=None, answer=Answer(finish_reason=rec.answer.finish_reason), shape=shape,
                           headers={k: v for k, v in rec.headers.items() if k == "content-type"}))
        if rec.answer.sha256 is not None and not rec.cancelled:
            answered.setdefault(rec.answer.sha256, rec.id)
        summary.requests += 1
    summary.texts, summary.tokens = s.texts, s.tokens
    return out, summary


def write_shape(folder: Path, model: Path | None = None, program: Path | None = None) -> ShapeSummary:
    """A session's recording shaped into its shape file beside it (ShapeError when no tokenizer can be found;
    RecordingError for a recording that cannot be read)."""
    from kvtrace.analyze.reader.session import RECORDED, SHAPE, read_manifest
    from kvtrace.capture.recording import read_records, write_records

    records = read_records(Path(folder) / RECORDED)
    tokenizer = find_tokenizer(read_manifest(folder), model, program)
    words, _ = vocabulary_words(tokenizer.model)
    shaped, summary = shape_records(records, Shaper(tokenizer, words))
    write_records(shaped, Path(folder) / SHAPE)
    return summary


# ---- replaying a shape --------------------------------------------------------------------------------------

def linked_ids(records: Iterable[RecordedRequest]) -> set[int]:
    """The requests whose replayed answers a shape sends back later."""
    return {int(link[1]) for r in records if r.shape for link in r.shape.get("links") or []}


def shaped_body(rec: RecordedRequest, answers: dict[int, str]) -> Any:
    """The body a shape's request is sent with: the answers this replay got for the linked requests put back,
    the answer made as long as it was."""
    body = copy.deepcopy(rec.body)
    shape = rec.shape or {}
    if not isinstance(body, dict):
        return body
    messages = body.get("messages")
    for index, k, *_ in shape.get("links") or []:
        if isinstance(messages, list) and 0 <= index < len(messages) and int(k) in answers:
            messages[index] = {**messages[index], "content": answers[int(k)]}
    tokens = shape.get("answer_tokens")
    if isinstance(tokens, int):
        present = [f for f in LENGTH_FIELDS if f in body]
        for f in present or (["n_predict"] if "messages" not in body and "prompt" in body else ["max_tokens"]):
            body[f] = tokens
        body["ignore_eos"] = True
    return body


__all__ = ["ShapeError", "ShapeSummary", "Shaper", "Tokenizer", "find_tokenizer", "linked_ids", "shape_body",
           "shape_records", "shaped_body", "vocabulary_words", "write_shape"]
