"""A small table of records (one dict per row): what the Python API returns instead of a DataFrame.

pandas is an extra (``pip install 'fedcache[pandas]'``); ``to_pandas()`` works where it is installed, and
``to_records()`` is what ``pandas.DataFrame(...)`` (or polars, or the csv module) takes anyway. In a
notebook a Table shows itself as an HTML table (``_repr_html_``).
"""
from __future__ import annotations

import csv
import html
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fedcache.disk import write_text
from fedcache.errors import UnknownNameError
from fedcache.wording import count, did_you_mean

HTML_ROWS = 50  # rows a notebook shows of a Table; the rest are counted


class Table:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = [dict(r) for r in rows]

    @property
    def columns(self) -> list[str]:
        """Every key of every row, in first-seen order."""
        return list(dict.fromkeys(k for r in self.rows for k in r))

    def to_records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install 'fedcache[pandas]' (or pip install pandas); "
                              "to_records() gives the rows without it") from None
        return pd.DataFrame(self.to_records(), columns=self.columns)

    def column(self, name: str) -> list[Any]:
        self._known(name)
        return [r.get(name) for r in self.rows]

    def where(self, **equal: Any) -> Table:
        self._known(*equal)
        return Table([r for r in self.rows if all(r.get(k) == v for k, v in equal.items())])

    def _known(self, *names: str) -> None:
        """A column no row has (``where(lrr=0.1)``) is refused: it matched nothing, an empty table without a word.
        A table of no rows has no columns to tell a misspelt one from, and filters to itself."""
        columns = self.columns
        unknown = [n for n in names if n not in columns]
        if unknown and self.rows:
            raise UnknownNameError(f"no column {unknown[0]!r}{did_you_mean(unknown[0], columns)}; the columns: "
                                   f"{', '.join(columns)}")

    def parsed(self, columns: Iterable[str]) -> Table:
        """``columns``' texts as numbers, booleans and None, as ``from_csv`` reads them back: a grid keeps its axis
        values as the texts they were given in (they name its folders), while a user filters by number
        (``where(lr=0.01)``)."""
        texts = set(columns)
        return Table([{k: _parse(v) if k in texts and isinstance(v, str) else v for k, v in r.items()} for r in self.rows])

    def to_csv(self, path: Path) -> Path:
        path = Path(path)
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.columns)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in self.rows)
        write_text(path, text.getvalue(), "the results table")
        return path

    @classmethod
    def from_csv(cls, path: Path) -> Table:
        with open(path, newline="") as fh:
            return cls([{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(fh)])

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.to_records())

    def __getitem__(self, i: int | slice) -> dict[str, Any] | Table:
        """A row as a dict (``table[0]``), or rows as a Table (``table[:5]``), copies either way."""
        if isinstance(i, slice):
            return Table(self.rows[i])
        try:
            return dict(self.rows[i])
        except TypeError:  # table["lr"], as a DataFrame takes a column: Python's message named a list
            raise TypeError(f"Table[{i!r}]: a row is Table[n] and rows Table[a:b]; a column is "
                            f"table.column({i!r})") from None

    def __repr__(self) -> str:
        return f"Table({count(len(self), 'row')}; columns: {', '.join(self.columns)})"

    def _repr_html_(self, max_rows: int = HTML_ROWS) -> str:
        """What a notebook shows: the first ``max_rows`` rows, numbers to 4 significant digits."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_shown(r.get(c)))}</td>" for c in self.columns) + "</tr>"
                       for r in self.rows[:max_rows])
        more = (f"<p>... {count(len(self) - max_rows, 'more row')} "
                "(all of them: to_records(), to_pandas())</p>" if len(self) > max_rows else "")
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<p>{count(len(self), 'row')}</p>{more}")


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _parse(text: str) -> Any:
    """CSV cells back to numbers, booleans and None (a swept value written as 1e-3 reads back as 0.001)."""
    if text == "":
        return None
    if text.lower() in ("true", "false"):  # True from Python, true as the command line and a grid spell it
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def in_rounds(rows: list[dict]) -> str:
    """`` in round 3`` (`` in rounds 2, 5``): where the diverged seeds of ``rows`` did (results.csv's diverged_round;
    a grid of an older fedcache kept none)."""
    rounds = sorted({int(r["diverged_round"]) for r in rows if str(r.get("diverged_round") or "").isdigit()})
    if not rounds:
        return ""
    return f" in round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))}"
