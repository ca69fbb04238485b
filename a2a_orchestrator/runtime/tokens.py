"""Token estimates close to a real tokenizer, with no vocabulary to download.

Budgets (FINAL_ANSWER's 900 tokens) are counted here. A real BPE tokenizer
needs its vocabulary, and the packages that fetch it at run time (tiktoken
from a blob store, Hugging Face's hub) fail on a machine without network;
the parent's model may use any of several vocabularies anyway. So this
module estimates, the way those tokenizers work: text is split into pieces
with the GPT-4 family's pre-tokenizer pattern (cl100k_base's, with Python's
character classes), and each piece is priced by what it holds:

- English and code: a word or identifier part (split at camel humps) is one
  token up to 6 letters, plus one per 5 letters beyond; a number is one
  token per 3 digits; a run of punctuation one per 3 changes of character;
  a run of spaces or newlines one.
- Han characters about 1.15 tokens each, kana 1.0, Hangul 1.1, other
  three-byte letters 1.0, two-byte letters (Cyrillic, Greek, Arabic,
  Hebrew...) 0.47; non-ASCII symbols 1.3 (four-byte ones, emoji, 2.5).

The rates were fitted against cl100k_base, the larger of the two OpenAI
vocabularies in use for CJK and Cyrillic text (o200k_base counts those 15-45%
lower, the same within a few percent elsewhere), so a budget errs towards a
shorter cut. `tests/runtime/token_calibration.json` holds the texts and their real
counts; `tests/runtime/test_tokens.py` keeps the estimate within 15% of each.

Every piece costs at least one token per `_MIN_CHARS_PER_TOKEN` characters,
so a scan can stop as soon as a budget is spent: counting against a budget
costs time in proportion to the budget, not to the text.
"""

from __future__ import annotations

import math
import re

__all__ = ["count_tokens", "prefix_within"]

_PIECE = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)"  # contractions
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"  # a run of letters, with one leading symbol or space
    r"|\d{1,3}"  # digits, three at a time
    r"| ?(?:[^\s\w]|_)+[\r\n]*"  # a run of symbols, with one leading space
    r"|\s*[\r\n]|\s+(?!\S)|\s+"  # whitespace
)
_HUMP = re.compile(r"[A-Z]*[^A-Z]*")
_RUN = re.compile(r"(.)\1*", re.DOTALL)
_CONTRACTIONS = frozenset(["s", "d", "m", "t", "ll", "ve", "re"])
_MIN_CHARS_PER_TOKEN = 64
"""No piece is priced below one token per this many characters (whitespace:
32, a repeated ASCII symbol: 48)."""

_WORD_FREE = 6
"""Letters a word part may have and still be one token."""
_WORD_LETTERS_PER_TOKEN = 5
_SYMBOL_RUNS_PER_TOKEN = 3
_SAME_SYMBOL_PER_TOKEN = 16
"""A run of one repeated ASCII symbol (`=====`): that many per token."""
_SPACES_PER_TOKEN = 32
_HAN, _KANA, _HANGUL, _THREE_BYTE, _TWO_BYTE = 1.15, 1.0, 1.1, 1.0, 0.47
_SYMBOL, _WIDE_SYMBOL = 1.3, 2.5


def _is_han(code: int) -> bool:
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x2E80 <= code <= 0x2FFF
        or 0xF900 <= code <= 0xFAFF
        or 0x20000 <= code <= 0x3FFFF
    )


def _letters_cost(letters: str) -> float:
    latin: list[str] = []
    cost = 0.0
    for char in letters:
        code = ord(char)
        if code < 0x250:  # ASCII and the Latin letters of Western and Central Europe
            latin.append(char)
        elif 0x3040 <= code <= 0x30FF:
            cost += _KANA
        elif 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
            cost += _HANGUL
        elif _is_han(code):
            cost += _HAN
        elif code < 0x800:
            cost += _TWO_BYTE
        else:
            cost += _THREE_BYTE
    if latin:
        # `ModuleNotFoundError` is Module/NotFound/Error to a tokenizer; a
        # long lowercase word is a few common fragments.
        for part in _HUMP.findall("".join(latin)):
            if part:
                cost += 1 + max(0, len(part) - _WORD_FREE) / _WORD_LETTERS_PER_TOKEN
    return cost


def _symbols_cost(symbols: str) -> float:
    cost = 0.0
    ascii_units = 0
    for run in _RUN.finditer(symbols):
        char, length = run.group(1), len(run.group())
        if ord(char) < 0x80:
            ascii_units += math.ceil(length / _SAME_SYMBOL_PER_TOKEN)
        elif ord(char) > 0xFFFF:
            cost += _WIDE_SYMBOL * length  # emoji: several tokens each, repeated or not
        else:
            cost += _SYMBOL * (1 + (length - 1) / 4)  # `────` merges like `====`
    return cost + math.ceil(ascii_units / _SYMBOL_RUNS_PER_TOKEN)


def _cost(piece: str) -> float:
    """The estimated tokens of one piece (at least one)."""
    body = piece[1:] if piece[0] == " " and len(piece) > 1 else piece
    first = body[0]
    if body.isspace():
        return 1 + (len(piece) - 1) // _SPACES_PER_TOKEN
    if first.isdigit():
        return 1.0
    if first == "'" and body[1:].lower() in _CONTRACTIONS:
        return 1.0
    if body[-1].isalpha():  # letters, maybe after one symbol
        lead, letters = ("", body) if first.isalpha() else (first, body[1:])
        # An ASCII lead (` `, `(`, `.`) joins the word's first token; a
        # non-ASCII one (a CJK comma or colon) is a token of its own.
        return max(1.0, _letters_cost(letters) + (1 if lead and ord(lead) >= 0x80 else 0))
    return max(1.0, _symbols_cost(body.rstrip("\r\n")))


def count_tokens(text: str) -> int:
    """The estimated token count of `text` (0 for "", at least 1 otherwise);
    `count_tokens(text) <= n` exactly when `prefix_within(text, n)` is all of it."""
    return math.ceil(sum(_cost(m.group()) for m in _PIECE.finditer(text)) - 1e-9)


def prefix_within(text: str, budget: float) -> int:
    """The length of the longest prefix of `text` estimated at `budget` tokens
    or fewer: whole pieces while they fit, then as much of the next one as
    fits, found by bisection. Reads only as far as the budget reaches."""
    spent = 0.0
    for match in _PIECE.finditer(text):
        piece = match.group()
        left = budget - spent
        # A piece longer than this cannot fit whatever it holds.
        if len(piece) <= _MIN_CHARS_PER_TOKEN * (left + 1):
            cost = _cost(piece)
            if cost <= left:
                spent += cost
                continue
        low, high = 0, min(len(piece), int(_MIN_CHARS_PER_TOKEN * (left + 1)))
        while low < high:
            middle = (low + high + 1) // 2
            if _cost(piece[:middle]) <= left:
                low = middle
            else:
                high = middle - 1
        return match.start() + low
    return len(text)
