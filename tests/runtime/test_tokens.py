"""The token estimate against real tokenizers' counts (measured once, checked in).

`token_calibration.json` holds English, code (Python, JavaScript, Go, JSON,
a diff, test output, logs), Chinese, Japanese, Korean, Russian, mixed
CJK-and-code, hashes and emoji, each with its count under cl100k_base and
o200k_base; how they were measured is in its `about`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from a2a_orchestrator.runtime.tokens import count_tokens, prefix_within

CALIBRATION: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "token_calibration.json").read_text(encoding="utf-8")
)["texts"]


@pytest.mark.parametrize("row", CALIBRATION, ids=[row["name"] for row in CALIBRATION])
def test_the_estimate_is_within_15_percent_of_a_real_tokenizer(row: dict[str, Any]) -> None:
    estimate = count_tokens(row["text"])
    assert abs(estimate - row["cl100k_base"]) <= 0.15 * row["cl100k_base"], estimate
    # o200k_base counts CJK and Cyrillic lower still: the estimate may be
    # above it there (a budget then cuts a little early), never far below.
    assert estimate >= 0.85 * row["o200k_base"], estimate


def test_cjk_counts_about_a_token_per_character() -> None:
    # The old estimate counted a run of Han characters as one word, a token
    # per four characters: 3-5 times under what a tokenizer counts.
    chinese = next(row for row in CALIBRATION if row["name"] == "chinese-prose")
    assert count_tokens(chinese["text"]) >= 0.85 * chinese["cl100k_base"]
    assert count_tokens("的" * 400) >= 400


def test_counts_are_consistent_with_prefixes() -> None:
    assert count_tokens("") == 0 and count_tokens("a") == 1 and count_tokens(" ") == 1
    for row in CALIBRATION:
        text = row["text"]
        total = count_tokens(text)
        assert prefix_within(text, total) == len(text)
        cut = prefix_within(text, total // 2)
        assert cut < len(text) and count_tokens(text[:cut]) <= total // 2


@pytest.mark.parametrize(
    "text",
    ["子" * 1_000_000, "=" * 1_000_000, " " * 1_000_000, "a" * 1_000_000, "🎉" * 200_000],
    ids=["han", "repeated-symbol", "spaces", "one-long-word", "emoji"],
)
def test_a_prefix_of_one_enormous_piece_is_found(text: str) -> None:
    # One pre-tokenizer piece of a million characters: cut inside it,
    # reading only as far as the budget reaches.
    cut = prefix_within(text, 900)
    assert 0 < cut < len(text)
    assert count_tokens(text[:cut]) <= 900 < count_tokens(text[: cut + 1])
