"""What a report and table.md say beside their numbers: which result is marked the best, what each figure means, what
runs shared, and what an unfinished grid has not shown yet."""
from __future__ import annotations

import json
from pathlib import Path

from fedcache.best import Result, best_marks
from fedcache.grids.table import summary_markdown
from fedcache.reports import write_report
from fedcache.table import Table
from tests.reports.test_report import fake_grid
from tests.conftest import BACKBONE


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}")[1].split("\n## ")[0]


def _rows(md: str) -> dict[str, str]:
    results = _section(md, "Results")
    return {line.split(" | ")[0].strip("| "): line for line in results.splitlines() if line.startswith("| ") and "---" not in line}


def test_a_reference_that_pools_every_clients_data_is_never_the_best_beside_federated_results():
    fed, ref = (lambda m: Result("a", m, True), lambda m: Result("a", m, True, reference=True))
    assert best_marks([fed(50.0), fed(60.0), ref(80.0)]) == [False, True, False]
    # Where nothing federated compares, the references are marked among themselves (a grid of centralized's lr).
    assert best_marks([ref(70.0), ref(80.0)]) == [False, True]
    # A lone federated result beside a reference is nobody's winner, and the reference does not take the mark.
    assert best_marks([fed(60.0), ref(80.0)]) == [False, False]
    # Each panel on its own: a panel of references alone marks its best even beside another with federated ones.
    assert best_marks([fed(50.0), fed(60.0), Result("b", 70.0, True, True), Result("b", 75.0, True, True)]) == \
        [False, True, False, True]


def test_a_grid_report_and_its_table_mark_the_best_federated_method_and_name_the_reference(tmp_path):
    """The demo's report put linear-probe (every client's rows pooled: the ceiling the others are read against) in bold
    as the best method."""
    root = fake_grid(tmp_path / "grid", methods=("fedavg", "fedprox", "centralized"), alphas=(1.0,), lrs=("0.01",),
                     seeds=(0, 1), rounds=3)
    for seed in (0, 1):  # as the driver writes a pooled method's summary
        path = root / "cells" / f"centralized__alpha=1.0__lr=0.01__seed={seed}" / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "pools_data": True}))
    md = write_report(root).markdown.read_text()
    rows = _rows(md)
    assert "**" in rows["fedprox"] and "**" not in rows["centralized"] and "**" not in rows["fedavg"]
    assert ("not counting centralized (trained on every client's data in one place: the reference, marked only where "
            "no other method compares)") in md
    # table.md's rule is the report's: it knows centralized pools its data from the method itself.
    table = summary_markdown(Table([{"method": m, "lr": "0.01", "seed": s, "mean_accuracy": acc}
                                    for m, acc in (("fedavg", 50.0), ("fedprox", 55.0), ("centralized", 70.0))
                                    for s in (0, 1)]))
    assert "| fedprox | **55.00" in table and "| centralized | 70.00" in table and "not counting centralized" in table


def test_a_run_s_summary_says_it_pools_the_data_or_reads_no_optimizer(toy_store, tmp_path):
    from fedcache.api import train

    def summary(method: str) -> dict:
        run = train(toy_store, "test-toy", BACKBONE, method, clients=2, rounds=1, out=tmp_path / method)
        return json.loads((run.out / "summary.json").read_text())

    central, fedavg, probe = summary("centralized"), summary("fedavg"), summary("linear-probe")
    assert central["pools_data"] is True and "pools_data" in central["definitions"] and "uses_optimizer" not in central
    assert "pools_data" not in fedavg and "pools_data" not in fedavg["definitions"] and "uses_optimizer" not in fedavg
    assert probe["pools_data"] is True and probe["uses_optimizer"] is False
    for key in ("global_accuracy", "worst10", "variance"):  # every figure of the report's table is defined
        assert key in fedavg["definitions"]


def test_the_report_says_how_many_clients_each_fairness_share_holds(tmp_path):
    """With five clients, the worst 10% and worst 20% columns are the same single client; nothing said so."""
    root = fake_grid(tmp_path / "grid", methods=("fedavg",), alphas=(1.0,), lrs=("0.01",), seeds=(0,), rounds=3)
    for cell in (root / "cells").iterdir():
        path = cell / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "per_client_accuracy": [50.0, 60, 70, 80, 90]}))
    md = write_report(root).markdown.read_text()
    said = ("of 5 clients: worst 10% and worst 20% are the worst client, worst 40% is the worst 2 clients, best 10% is "
            "the best client")
    assert said in _section(md, "Results") and said in _section(md, "Fairness")
    # A share is rounded up, as summary.json's figures take it: of 25 clients the worst 10% is 3, not 2.
    from fedcache.federate.metrics import fairness
    from fedcache.reports import shares_text
    from fedcache.reports.runs import Run

    assert fairness(list(range(25)))["worst10"] == 1.0  # the mean of 0, 1 and 2
    assert shares_text([Run(root, {"per_client_accuracy": list(range(25))}, [], {})]).startswith(
        "of 25 clients: worst 10% is the worst 3 clients, worst 20% is the worst 5 clients")
    assert "global % is the global model's accuracy on every row of the split" in md


def test_fewer_seeds_are_said_not_marked_best_only_under_figures_that_mark_a_best(tmp_path):
    root = fake_grid(tmp_path / "grid", methods=("fedavg", "fedprox"), alphas=(1.0,), lrs=("0.01",), seeds=(0, 1, 2), rounds=3)
    (root / "grid.json").write_text(json.dumps({"methods": ["fedavg", "fedprox"], "seeds": [0, 1, 2],
                                                "sweep": {"alpha": ["1.0"], "lr": ["0.01"]}, "select": []}))
    (root / "cells" / "fedprox__alpha=1.0__lr=0.01__seed=2" / "summary.json").unlink()
    md = write_report(root).markdown.read_text()
    for title in ("Accuracy per round", "Final accuracy"):
        assert "Drawn from fewer seeds: fedprox: 2 seeds of 3 (1 not run yet); not marked best." in _section(md, title)
    for title in ("Training loss per round", "Fairness", "Bytes sent per round"):
        text = _section(md, title)
        assert "Drawn from fewer seeds: fedprox: 2 seeds of 3 (1 not run yet)." in text and "marked best" not in text


def test_an_unfinished_grid_keeps_its_swept_setting_a_column_and_names_the_methods_with_no_result(tmp_path):
    """With only the lr=0.001 cells finished, the report said "fixed: ... lr=0.001" of a grid of two lr values, and
    left fedprox (no finished cell) out without a word."""
    root = fake_grid(tmp_path / "grid", methods=("fedavg", "fedprox"), alphas=(1.0,), lrs=("0.001", "0.01"), seeds=(0,),
                     rounds=3)
    (root / "grid.json").write_text(json.dumps({"methods": ["fedavg", "fedprox"], "seeds": [0],
                                                "sweep": {"alpha": ["1.0"], "lr": ["0.001", "0.01"]}, "select": []}))
    for cell in (root / "cells").iterdir():
        if "fedprox" in cell.name or "lr=0.01" in cell.name:
            (cell / "summary.json").unlink()
    md = write_report(root).markdown.read_text()
    results = _section(md, "Results")
    assert "Unfinished grid: 1 of its 4 cells has a result; no cell of fedprox has one yet" in results
    assert "| method | lr |" in results and "lr=0.001" not in results.split("\n\n")[0]
    assert "fixed: partition=dirichlet, alpha=1.0, rounds=3" in results


def _separate_run(root: Path, method: str, optim: dict, acc: float, **summary) -> None:
    run = root / method
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": acc, "per_client": [acc, acc]}) + "\n")
    (run / "summary.json").write_text(json.dumps({"method": method, "mean_accuracy": acc, "per_client_accuracy": [acc, acc],
                                                  "rounds": 1, **summary}))
    spec = {"data": {"dataset": "digits", "backbones": ["lite0"]},
            "partition": {"scheme": "domain", "clients": 2, "alpha": 0.5, "few_shot": 10},
            "schedule": {"rounds": 1, "seed": 0}, "head": {"name": "linear"}, "optim": optim}
    (run / "config.json").write_text(json.dumps({"spec": spec}))


def test_a_report_of_separate_runs_says_what_they_share_and_where_they_differ(tmp_path):
    """The demo's report said nothing of its runs' partition or rounds, and hid that fst-cbdg trained with SGD at
    lr=0.01 beside the others' Adam at 0.001."""
    adam, sgd = {"optimizer": "adam", "lr": 0.001, "momentum": 0.9}, {"optimizer": "sgd", "lr": 0.01, "momentum": 0.5}
    _separate_run(tmp_path / "runs", "fedavg", adam, 60.0)
    _separate_run(tmp_path / "runs", "fst-cbdg", sgd, 50.0)
    _separate_run(tmp_path / "runs", "linear-probe", adam, 70.0, uses_optimizer=False, pools_data=True)
    md = write_report(tmp_path / "runs").markdown.read_text()
    said = _section(md, "Results").split("\n\n")[1]
    # alpha is not read by the domain partition; the optimizer of linear-probe, which fits no optimizer, is not said.
    assert "Every run: partition=domain, clients=2, few_shot=10, rounds=1, seed=0, head=linear;" in said
    assert "they differ in optimizer: adam (fedavg), sgd (fst-cbdg); lr: 0.001 (fedavg), 0.01 (fst-cbdg)." in said
    assert "alpha" not in said and "momentum" not in said  # Adam reads no momentum: only one run has one
    assert "**" not in _rows(md)["linear-probe"] and "**" in _rows(md)["fedavg"]
    assert "How to read the table:" in _section(md, "Results").split("\n\n")[2]
    html = (tmp_path / "runs" / "report.html").read_text()
    assert "<p>How to read the table:" in html  # a paragraph of its own
