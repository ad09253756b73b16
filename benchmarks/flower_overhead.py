"""Per-round time of fedavg, 10 clients: the in-process engine vs Flower's simulation engine vs a
loopback deployment (a SuperLink and 10 SuperNodes as processes on 127.0.0.1, `flwr run`).

Data: a synthetic 10-class problem (10 clients x 100 rows x 256-d, Gaussian classes) imported into
a real feature store with `import_file`, sharded with `fedcache shard`'s code. 3 rounds, evaluation
after the last only. Per-round times: in-process, the whole run / rounds (best of 3); Flower, the
server's own per-round wall time (``rounds.jsonl``: send, wait for every reply, aggregate), plus
the whole run's wall time including start-up. Every Flower engine must give the in-process accuracy.

    .venv/bin/python benchmarks/flower_overhead.py [--out benchmarks/results/flower_overhead.json]
    .venv/bin/python benchmarks/flower_overhead.py --render    # the markdown section of docs/performance.md
    .venv/bin/python benchmarks/flower_overhead.py --tiny --engines in_process,simulation --out /tmp/f.json  # smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import meta  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "flower_overhead.json"
DATASET, BACKBONE = "synthetic-10", "imported"
ENGINES = ("in_process", "simulation", "deployment")


@dataclass(frozen=True)
class Size:
    clients: int = 10
    rounds: int = 3
    dim: int = 256
    per_client: int = 100
    test_rows: int = 1000
    trials: int = 3  # in-process runs (best of)


TINY = Size(clients=2, rounds=1, dim=8, per_client=20, test_rows=40, trials=1)


def make_store(path: Path, size: Size) -> None:
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.interchange import import_file

    rng = np.random.default_rng(0)
    means = rng.normal(size=(10, size.dim)).astype(np.float32)
    arrays = {}
    for split, n in (("train", size.clients * size.per_client), ("test", size.test_rows)):
        y = rng.integers(0, 10, n)
        arrays[f"{split}__features"] = means[y] + 2.0 * rng.normal(size=(n, size.dim)).astype(np.float32)
        arrays[f"{split}__labels"] = y
    npz = path.parent / "synthetic.npz"
    np.savez(npz, **arrays)
    import_file(FeatureStore(path), npz, DATASET, BACKBONE)


def config(store: Path, size: Size, **kw):
    from fedcache.spec import RunSpec

    return RunSpec.of(store=store, dataset=DATASET, backbones=[BACKBONE], method="fedavg", partition="iid",
                      clients=size.clients, rounds=size.rounds, eval_every=size.rounds, **kw)


def in_process(store: Path, work: Path, size: Size) -> dict:
    from fedcache.training import train

    runs = []
    for _ in range(size.trials):
        t0 = time.perf_counter()
        result = train(config(store, size))
        runs.append(time.perf_counter() - t0)
    return {"per_round_s": min(runs) / size.rounds, "run_s": min(runs), "accuracy": result.summary["mean_accuracy"]}


def _flower_times(out: Path, wall: float, summary: dict) -> dict:
    rounds = [json.loads(l) for l in (out / "rounds.jsonl").read_text().splitlines()]
    secs = [r["seconds"] for r in rounds]
    return {"per_round_s": statistics.median(secs), "round_s": secs, "run_s": wall, "accuracy": summary["mean_accuracy"]}


def simulation(store: Path, work: Path, size: Size) -> dict:
    from fedcache.flower.sim import train_flower_sim_here  # in this process, as `fedcache train` runs it

    out = work / "sim"
    t0 = time.perf_counter()
    summary = train_flower_sim_here(config(store, size, out=out))
    return _flower_times(out, time.perf_counter() - t0, summary)


def deployment(store: Path, work: Path, size: Size) -> dict:
    from fedcache.flower.config import FlowerRun
    from fedcache.flower.local import LocalDeployment
    from fedcache.flower.project import write_app
    from fedcache.flower.shard import client_dir, write_shards
    from fedcache.flower.sim import shard_spec

    write_shards(shard_spec(config(store, size)), work / "shards")
    write_app(work / "app")
    run = FlowerRun.of(method="fedavg", rounds=size.rounds, eval_every=size.rounds, connect_timeout=300)
    with LocalDeployment(work, [client_dir(work / "shards", k) for k in range(size.clients)]) as d:
        t0 = time.perf_counter()
        summary, out = d.run(work / "app", run, timeout=580)
        wall = time.perf_counter() - t0
    return _flower_times(out, wall, summary)


def measure(size: Size, engines: tuple[str, ...] = ENGINES) -> dict:
    with tempfile.TemporaryDirectory(prefix="flower-overhead-") as tmp:
        work = Path(tmp)
        store = work / "store.zarr"
        make_store(store, size)
        results = {e: globals()[e](store, work, size) for e in engines}
    return {"config": {"method": "fedavg", "clients": size.clients, "rounds": size.rounds, "dim": size.dim,
                       "rows_per_client": size.per_client},
            "results": results, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                            "note": f"1-minute load average {os.getloadavg()[0]:.1f} at the end"},
            "meta": meta()}


def render(path: Path = RESULT) -> str:
    data = json.loads(path.read_text())
    c, r = data["config"], data["results"]
    lines = [f"`.venv/bin/python benchmarks/flower_overhead.py`: {c['method']}, {c['clients']} clients x "
             f"{c['rows_per_client']} rows x {c['dim']}-d, {c['rounds']} rounds, evaluation after the last "
             f"({data['machine']['cpus']} CPUs, {data['machine']['note']}).", "",
             "| engine | per round (s) | whole run incl. start-up (s) | accuracy % |", "|---|---|---|---|"]
    names = {"in_process": "in-process", "simulation": "Flower simulation (Ray)", "deployment": "loopback deployment (10 SuperNodes)"}
    for key, name in names.items():
        if key not in r:
            continue
        v = r[key]
        lines.append(f"| {name} | {v['per_round_s']:.3f} | {v['run_s']:.1f} | {v['accuracy']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="2 clients x 20 rows, 1 round: checks the script runs, measures nothing")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    args = ap.parse_args(argv)
    if args.render:
        print(render(args.out))
        return
    engines = tuple(args.engines.split(","))
    if unknown := [e for e in engines if e not in ENGINES]:
        ap.error(f"--engines: unknown {', '.join(unknown)} (known: {', '.join(ENGINES)})")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    data = measure(TINY if args.tiny else Size(), engines)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(render(args.out))


if __name__ == "__main__":
    main()
