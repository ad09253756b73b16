"""The table the Python API returns (fedcache/table.py): rows by number or slice, filters by known columns."""
from __future__ import annotations

import pytest

from fedcache.errors import FedcacheError, UnknownNameError
from fedcache.table import Table

ROWS = [{"method": m, "lr": lr, "mean_accuracy": acc} for m, lr, acc in
        [("fedavg", 0.01, 50.0), ("fedavg", 0.1, 60.0), ("fedproto", 0.01, 55.0)]]


def test_a_slice_is_a_table_of_those_rows_as_a_number_is_one_row():
    """table[0:2] raised "dictionary update sequence element #0 has length 3; 2 is required"."""
    table = Table(ROWS)
    assert isinstance(table[0:2], Table) and table[0:2].to_records() == ROWS[:2]
    assert table[-1:].to_records() == ROWS[-1:] and table[::2].to_records() == ROWS[::2] and len(table[5:]) == 0
    assert table[0] == ROWS[0] and table[-1] == ROWS[-1]  # a number is still one row, as a dict
    sliced = table[0:1]
    sliced.rows[0]["lr"] = 9  # the slice's rows are copies, as a row by number is
    assert table[0]["lr"] == 0.01


def test_a_column_by_name_in_brackets_says_how_to_get_it():
    with pytest.raises(TypeError) as err:
        Table(ROWS)["lr"]
    assert str(err.value) == "Table['lr']: a row is Table[n] and rows Table[a:b]; a column is table.column('lr')"


def test_an_unknown_column_is_refused_with_the_one_meant_and_the_columns():
    """where(lrr=0.1) matched no row, and said nothing: an empty table, as if no run had that learning rate."""
    table = Table(ROWS)
    with pytest.raises(UnknownNameError) as err:
        table.where(lrr=0.1)
    assert str(err.value) == "no column 'lrr' (did you mean 'lr'?); the columns: method, lr, mean_accuracy"
    assert isinstance(err.value, KeyError) and isinstance(err.value, FedcacheError)
    with pytest.raises(UnknownNameError, match="^no column 'mean_acc' \\(did you mean 'mean_accuracy'\\?\\)"):
        table.column("mean_acc")
    assert len(table.where(lr=0.01, method="fedavg")) == 1 and table.column("lr") == [0.01, 0.1, 0.01]
    assert len(Table([]).where(lr=0.01)) == 0 and Table([]).column("lr") == []  # no rows: no columns to check
    ragged = Table([{"a": 1}, {"a": 2, "diverged_round": 3}])  # a column some rows lack is a column
    assert ragged.column("diverged_round") == [None, 3] and len(ragged.where(diverged_round=3)) == 1


def test_one_row_is_said_as_one_row():
    """A one-row table (and every TrainResult's summary) said "1 rows"."""
    one = Table(ROWS[:1])
    assert repr(one).startswith("Table(1 row; columns: ") and repr(Table(ROWS)).startswith("Table(3 rows; ")
    assert one._repr_html_().endswith("</table><p>1 row</p>")
    assert Table(ROWS)._repr_html_(max_rows=2).endswith("<p>3 rows</p><p>... 1 more row (all of them: to_records(), "
                                                        "to_pandas())</p>")
    assert "<p>... 2 more rows " in Table(ROWS)._repr_html_(max_rows=1)
