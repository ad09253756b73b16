"""Words shared by messages: counts ("1 run", "2 runs", "3 batches") and the near names of a typo."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def did_you_mean(name: str, known, n: int = 1, cutoff: float = 0.6) -> str:
    """ " (did you mean 'dirichlet'?)" for a typo of one of ``known`` (up to ``n`` close names), or ""."""
    import difflib

    near = difflib.get_close_matches(name, [str(k) for k in known], n=n, cutoff=cutoff)
    return f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
