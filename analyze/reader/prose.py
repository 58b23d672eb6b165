"""Draft acceptance told in a report's own words, not in a log line's: the regexes the walker runs over prose.

A report says `very low draft acceptance, ~0.5` or `112/141 accepted draft tokens` where no statistics line came
with it. The walker keeps such a figure as a `prose_acceptance` event, apart from the log's own counts (it never
enters the acceptance figures); it says a speculative run was measured only where the prose also names the
drafter that ran. Each regex carries its examples and counter-examples, which tests/analyze/reader/test_prose.py
holds it to.
"""

from __future__ import annotations

import re

from kvtrace.analyze.reader.spec import DRAFTER_NAMES

# a draft acceptance told in the report's words, not a log line's (`very low draft acceptance, ~0.5`, "`draft
# acceptance` 0.41-0.65", `an acceptance rate of 65 %`): a speculative run's statistics, kept apart from the
# log's own counts (they never enter the acceptance figures)
PROSE_ACCEPTANCE_WORDS = re.compile(
    r"(?:(?:draft|mtp) accept(?:ance|ed)(?: rate)?|accept(?:ance)? rate)\W{0,3}(?:[a-z]+\W{1,3}){0,3}[~\u2248]?\s*"
    r"(?:0?\.\d+|\d{1,3}(?:\.\d+)?\s?%)"  # up to three words before the figure: `is very low, ~0.5`
    # the figure (or a range) before the word: `38-71% acceptance depending on context`, `78.7 % MTP acceptance`
    r"|\b\d{1,3}(?:\.\d+)?(?:\s?[-\u2013]\s?\d{1,3}(?:\.\d+)?)?\s?% (?:draft |mtp )?acceptance\b"
    # llama.cpp's own count (`accepted 3/4 draft tokens`) quoted in the report's words: `154/156 drafted tokens`,
    # `112/141 accepted draft tokens`, `210 / 267 accepted draft tokens`, and counted in drafts, llama.cpp's own
    # unit in its statistics line (`#gen drafts`, `#acc drafts`): `112/112 accepted drafts`
    r"|\b\d+\s?/\s?\d+ (?:accepted )?draft(?:ed)? tokens|\b\d+\s?/\s?\d+ accepted drafts\b"
    # the two counts told apart, the drafted first: `18 draft tokens, 9 accepted`, `~80 draft tokens from which 3
    # are accepted`, `120 drafted tokens and 97 accepted` (a count, not `none`: no figure, no statistics)
    r"|\b\d+ draft(?:ed)? tokens?\W{1,3}(?:(?:and|of which|from which|with)\s)?\d+ (?:(?:are|were)\s)?accepted\b",
    re.IGNORECASE)
# a drafter named where the acceptance is told (`MTP active, 112/141 accepted draft tokens`, `draft-mtp n-max 4:
# ... 38-71% acceptance`, `-md small.gguf`, llama.cpp's n-gram speculative types `ngram-map-k`, `ngram-mod`,
# `ngram_mod`, `ngram-k4v`): the figures are a measured speculative setup's; speculative decoding named in general
# (`./speculative always reports 100 %`) is not enough
DRAFTER_NAMED = re.compile(
    rf"\b(?:{'|'.join(n for n in DRAFTER_NAMES if n != 'draft')})\d?\b"  # `draft` alone is too common a word
    r"|\bdraft[- ](?:model|head)|(?:^|\s)(?:-md|--model-draft)\s"
    r"|\bngram[-_](?:simple|map-k(?:4v)?|mod|k4v)\b",
    re.IGNORECASE)

# Sentences each regex must find (`EXAMPLES`) and must not (`COUNTER_EXAMPLES`): the report wordings it was
# written for, and the near misses it must leave alone.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "PROSE_ACCEPTANCE_WORDS": (
        "very low draft acceptance, ~0.5",
        "`draft acceptance` 0.41-0.65",
        "an acceptance rate of 65 %",
        "38-71% acceptance depending on context",
        "78.7 % MTP acceptance",
        "MTP active, 112/141 accepted draft tokens",
        "154/156 drafted tokens",
        "210 / 267 accepted draft tokens",
        "112/112 accepted drafts",
        "18 draft tokens, 9 accepted",
        "~80 draft tokens from which 3 are accepted",
        "120 drafted tokens and 97 accepted",
    ),
    "DRAFTER_NAMED": (
        "MTP active, 112/141 accepted draft tokens",
        "draft-mtp n-max 4: 38-71% acceptance",
        "llama-server -m big.gguf -md small.gguf",
        "with a draft model",
        "EAGLE3 head",
        "`ngram-map-k` 222.24 wall tok/s",
        "ngram_mod at n_max 8",
        "ngram-k4v",
    ),
}
COUNTER_EXAMPLES: dict[str, tuple[str, ...]] = {
    "PROSE_ACCEPTANCE_WORDS": (
        "~80 draft tokens from which none are accepted",  # no figure: no statistics
        "the draft was not accepted | see below",
        "| Model | Accepted answers % | Notes |",
        "tokens accepted by the grammar: 12",
        "throughput +4.21%",
    ),
    "DRAFTER_NAMED": (
        "when using the ./speculative to run speculative inference, the acceptance rate will always be 100%.",
        "speculative decoding is on",
        "the ngram of the prompt",
        "the draft PR was merged",
    ),
}
