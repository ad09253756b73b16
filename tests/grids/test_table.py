"""A grid's table (fedcache/grids/table.py): mean (sample std) over seeds, the best of each column in bold."""
from __future__ import annotations

from fedcache.grids import summary_markdown
from fedcache.table import Table


def test_table_marks_the_best_mean_of_each_column():
    rows = [{"method": m, "lr": lr, "seed": s, "mean_accuracy": acc} for m, lr, s, acc in
            [("a", "1", 0, 50.0), ("a", "1", 1, 60.0), ("b", "1", 0, 70.0), ("b", "1", 1, 70.0),
             ("a", "2", 0, 90.0), ("a", "2", 1, 80.0), ("b", "2", 0, 10.0), ("b", "2", 1, 20.0)]]
    md = summary_markdown(Table(rows))
    assert "| a | 55.00 (7.07) | **85.00 (7.07)** |" in md  # sample std (ddof=1) over seeds, as the papers print
    assert "| b | **70.00 (0.00)** | 15.00 (7.07) |" in md
    assert "sample std, ddof=1" in md
