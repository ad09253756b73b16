"""Counts in messages: "1 run", "2 runs", "1 batch", "3 batches"."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
