"""What separate runs reported together share and where they differ: a grid's caption says its fixed options and its
columns the swept ones, but runs trained one by one (the demo's, a folder of `fedcache train` runs) record theirs only
in each config.json, and a report that said none of them hid that one method ran with another optimizer."""
from __future__ import annotations

from fedcache.federate.optim_config import OPTIMIZERS_KNOWN
from fedcache.federate.partitions.core import readers
from fedcache.reports.runs import Run
from fedcache.spec import option

# The options that decide what a run trains on and how long, by their `fedcache train` names, and the optimizer's
# fields (set by a method's preset: fst-cbdg's SGD beside the others' Adam).
SAID = ("partition", "clients", "alpha", "shards", "few_shot", "class_budget", "subsample", "clients_per_domain",
        "classes_per_client", "repeat_rate", "local_test", "local_test_mix", "rounds", "fraction", "local_epochs",
        "batch_size", "seed", "head")
OPTIMIZER = ("optimizer", "lr", "momentum", "weight_decay")
MAX_LISTED = 4  # methods named per value where runs differ; more are counted


def options_text(runs: list[Run]) -> str:
    """`` Every run: partition=domain, ...; they differ in optimizer: adam (fedavg, ...), sgd (fst-cbdg).`` for
    runs that hold their options (config.json) and are no grid's cells; empty otherwise."""
    if len(runs) < 2 or any(r.setting for r in runs) or not all(r.config.get("spec") for r in runs):
        return ""
    values = [_values(r) for r in runs]
    keys = list(dict.fromkeys(k for v in values for k in v))
    shared = [k for k in keys if len({v.get(k) for v in values}) == 1]
    # A setting some runs do not read (the optimizer of linear-probe, SGD's momentum) differs only among those that do.
    differ = [k for k in keys if len({v[k] for v in values if k in v}) > 1]
    text = " Every run: " + ", ".join(f"{k}={values[0][k]}" for k in shared) if shared else ""
    if differ:
        text += (";" if text else " The runs") + " they differ in " + "; ".join(_differing(k, runs, values) for k in differ)
    return text + "." if text else ""


def _values(run: Run) -> dict[str, str]:
    """The run's options of SAID that its partition reads, and its optimizer's fields, as text."""
    scheme = run.option("partition")
    out = {}
    for name in SAID:
        value = run.option(name)
        if value is None or (name != "partition" and option(name).section == "partition" and scheme not in readers(name)):
            continue  # a partition option its scheme does not read (alpha of a domain partition)
        out[name] = str(value)
    optim = (run.config.get("spec") or {}).get("optim") or {}
    if run.summary.get("uses_optimizer", True):
        unread = OPTIMIZERS_KNOWN[optim["optimizer"]].unread if optim.get("optimizer") in OPTIMIZERS_KNOWN else {}
        out.update({k: str(optim[k]) for k in OPTIMIZER if k in optim and k not in unread})  # Adam's momentum: none
    return out


def _differing(key: str, runs: list[Run], values: list[dict[str, str]]) -> str:
    """``optimizer: adam (fedavg, fedpcl), sgd (fst-cbdg)``: each value with the methods that ran with it."""
    by_value: dict[str, list[str]] = {}
    for r, v in zip(runs, values):
        if key in v:
            by_value.setdefault(v[key], []).append(r.summary["method"])
    said = []
    for value, methods in by_value.items():
        methods = list(dict.fromkeys(methods))
        more = len(methods) - MAX_LISTED if len(methods) > MAX_LISTED + 1 else 0  # "and 1 more" says no less than its name
        listed = ", ".join(methods[:len(methods) - more]) + (f" and {more} more" if more else "")
        said.append(f"{value} ({listed})")
    return f"{key}: {', '.join(said)}"
