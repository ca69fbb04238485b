"""textkit: small text helpers."""


def word_count(text: str) -> int:
    """How many whitespace-separated words `text` holds."""
    return len(text.split())
