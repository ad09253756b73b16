"""Torch threads for the `fedcache` command, idle and beside busy work: an interleaved A/B of whole runs.

Each run is a whole `python -m fedcache.cli train ...` process, as users run it, timed from its start to its
exit, writing its run directory (-o). The arms:
  policy   the command as it is: it chooses its thread count itself (fedcache/cli/threads.py)
  default  the same command under OMP_NUM_THREADS=<torch's default count on this machine>: what the command ran
           with before it had a policy (a user's OMP_NUM_THREADS always wins)
  one      OMP_NUM_THREADS=1 (not run unless named in --arms)
The workloads (features are seeded Gaussian classes of the named width, written to a feature file and brought
into a temporary store through `fedcache store import`; the arithmetic depends on the shapes alone):
  linear-1280  fedavg, linear head, 1280-d (one efficientnet-lite backbone), 7,500 training / 5,000 test rows
               (digits5-offline's sizes), 10 clients, Dirichlet 0.5, 20 rounds, evaluation every round
  linear-3840  the same on 3840-d features (three fused backbones)
  mlp-1280     fedavg, mlp head (FC D->256, BatchNorm, FC 256->10), 1280-d, the same rows and clients, 5 rounds
  mlp-3840     the same on 3840-d features
  flute-784    FLUTE's LR-MNIST shape (benchmarks/published.py): linear head on 784-d, 60,000 / 10,000 rows,
               1,000 clients of 2 label shards each, 10 per round, batch 10, SGD lr 0.03, 100 rounds,
               evaluation every 20
Before timing, each workload runs one untimed round (the partition is stored, the files are in the page cache).
The conditions alternate inside every trial, and the order of the arms and of the conditions flips from one trial
to the next: idle (the benchmark starts nothing and waits, up to --quiet-wait seconds, until other work keeps less
than --quiet-below cores busy; what else ran is recorded per run as `background_cores`, the busy cores not spent
by the run itself, from /proc/stat) and loaded (--load processes that each spin one core, started --settle seconds
before the loaded runs and always stopped after them; each also stops by itself after --load-seconds). After the
arms of a workload, their final checkpoints (every client's and the server's state) are compared bit for bit
(`same_final_state`).

    .venv/bin/python benchmarks/threads.py [--trials 3] [--load N] [--only linear-1280,flute-784] [--out benchmarks/results/threads.json]
    .venv/bin/python benchmarks/threads.py --arms one,default --conditions idle --out benchmarks/results/threads_one.json
    .venv/bin/python benchmarks/threads.py --render [--out FILE]   # the markdown table of docs/performance.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import write  # benchmarks/ is on sys.path when a script here runs
from _runs import child_env, fedcache, timed_train, wait_for_quiet

RESULT = Path(__file__).resolve().parent / "results" / "threads.json"
SGD = ["--set", "optimizer=sgd", "--set", "lr=0.03", "--set", "momentum=0", "--set", "weight_decay=0"]
# name: (feature width, training rows, test rows, `fedcache train` options)
WORKLOADS = {
    "linear-1280": (1280, 7500, 5000, ["-m", "fedavg", "--head", "linear", "--partition", "dirichlet", "--alpha", "0.5",
                                       "--clients", "10", "--rounds", "20"]),
    "mlp-3840": (3840, 7500, 5000, ["-m", "fedavg", "--head", "mlp", "--partition", "dirichlet", "--alpha", "0.5",
                                    "--clients", "10", "--rounds", "5"]),
    "linear-3840": (3840, 7500, 5000, ["-m", "fedavg", "--head", "linear", "--partition", "dirichlet", "--alpha", "0.5",
                                       "--clients", "10", "--rounds", "20"]),
    "mlp-1280": (1280, 7500, 5000, ["-m", "fedavg", "--head", "mlp", "--partition", "dirichlet", "--alpha", "0.5",
                                    "--clients", "10", "--rounds", "5"]),
    "flute-784": (784, 60000, 10000, ["-m", "fedavg", "--head", "linear", "--partition", "shards", "--shards", "2",
                                      "--clients", "1000", "--fraction", "0.01", "--batch-size", "10", "--rounds", "100",
                                      "--eval-every", "20", *SGD]),
}
TINY = {
    "linear-1280": (32, 300, 100, ["-m", "fedavg", "--head", "linear", "--clients", "3", "--rounds", "2"]),
    "mlp-3840": (48, 300, 100, ["-m", "fedavg", "--head", "mlp", "--clients", "3", "--rounds", "2"]),
    "flute-784": (24, 400, 100, ["-m", "fedavg", "--head", "linear", "--partition", "shards", "--shards", "2",
                                 "--clients", "20", "--fraction", "0.1", "--batch-size", "10", "--rounds", "3", *SGD]),
}
SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def torch_default_threads() -> int:
    """torch's own thread count in a fresh process that sets nothing (this process may have been started with
    OMP_NUM_THREADS)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=child_env(),
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def write_features(path: Path, dim: int, n_train: int, n_test: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=0.5, size=(10, dim)).astype(np.float32)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        return means[y] + rng.normal(size=(n, dim)).astype(np.float32), y

    (xtr, ytr), (xte, yte) = split(n_train), split(n_test)
    np.savez(path, train__features=xtr, train__labels=ytr, test__features=xte, test__labels=yte)


class Load:
    """``n`` processes spinning one core each, for at most ``seconds``; stopped on leaving the block."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds, self.procs = n, seconds, []

    def __enter__(self) -> "Load":
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(self.seconds)]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def arm_envs(arms: list[str], default: int) -> dict[str, dict]:
    known = {"policy": child_env(), "default": child_env(OMP_NUM_THREADS=str(default)), "one": child_env(OMP_NUM_THREADS="1")}
    return {a: known[a] for a in arms}


def measure(workloads: dict, store: Path, trials: int, arms: list[str], load: int, load_seconds: float,
            settle: float, quiet: tuple[float, float], tmp: Path, conditions: list[str]) -> dict:
    default = torch_default_threads()
    envs = arm_envs(arms, default)
    runs = {c: {w: {a: [] for a in arms} for w in workloads} for c in conditions}
    same = {c: {w: [] for w in workloads} for c in runs}
    for t in range(trials):
        order = arms if t % 2 == 0 else arms[::-1]
        for condition in conditions if t % 2 == 0 else conditions[::-1]:
            with Load(load if condition == "loaded" else 0, load_seconds):
                time.sleep(settle if condition == "loaded" else 0)
                for name, (_, _, _, opts) in workloads.items():
                    args = ["--store", str(store), "-d", name, "-b", f"synthetic-{name}", *opts]
                    for arm in order:
                        waited = wait_for_quiet(*quiet) if condition == "idle" else 0.0
                        run = {**timed_train([*args, "-o", str(tmp / arm), "--overwrite"], envs[arm]), "waited_for_quiet": waited}
                        runs[condition][name][arm].append(run)
                        print(f"trial {t + 1} {condition} {name} {arm}: {run['wall_seconds']:.1f} s on {run['threads']} threads, "
                              f"other busy cores {run['background_cores']}", file=sys.stderr, flush=True)
                    same[condition][name].append(same_state(*(tmp / a / "checkpoint.pt" for a in arms)))
    return {"torch_default_threads": default, "runs": runs, "summary": summarise(runs, arms),
            "same_final_state": same}


def same_state(*paths: Path) -> bool:
    """Whether the runs' last checkpoints (every client's and the server's state) are equal bit for bit."""
    import torch

    def flat(x, key=""):
        if isinstance(x, dict):
            return [p for k in sorted(x, key=str) for p in flat(x[k], f"{key}/{k}")]
        if isinstance(x, (list, tuple)):
            return [p for i, v in enumerate(x) for p in flat(v, f"{key}[{i}]")]
        return [(key, x)]

    from fedcache.federate.rundir import load_checkpoint  # checked against its digest, which covers the seconds

    states = [flat(load_checkpoint(p)) for p in paths]
    return all(len(s) == len(states[0]) and all(
        ka == kb and (torch.equal(a, b) if torch.is_tensor(a) else a == b or "seconds" in ka)
        for (ka, a), (kb, b) in zip(s, states[0])) for s in states[1:])


def summarise(runs: dict, arms: list[str]) -> dict:
    """Per condition and workload: each arm's median wall time and, per trial, the reference arm's time over the
    policy's (above 1: the policy is faster)."""
    out: dict = {}
    for condition, by_workload in runs.items():
        for name, by_arm in by_workload.items():
            row = {a: {"median_wall_seconds": round(statistics.median(r["wall_seconds"] for r in rs), 2),
                       "threads": sorted({r["threads"] for r in rs if r["threads"] is not None})}
                   for a, rs in by_arm.items()}
            row["background_cores"] = [r["background_cores"] for rs in by_arm.values() for r in rs]
            if "policy" in by_arm:
                for ref in (a for a in by_arm if a != "policy"):
                    ratios = [round(r["wall_seconds"] / p["wall_seconds"], 2) for r, p in zip(by_arm[ref], by_arm["policy"])]
                    row[f"{ref}_over_policy"] = {"per_trial": ratios, "median": round(statistics.median(ratios), 2)}
            out.setdefault(condition, {})[name] = row
    return out


def prepare(store: Path, workloads: dict, tmp: Path) -> None:
    """Each workload's features imported, and one untimed round run on them (which stores the partition beside
    them and brings the files into the page cache, for every timed run alike)."""
    for name, (dim, n_train, n_test, opts) in workloads.items():
        path = tmp / f"{name}.npz"
        write_features(path, dim, n_train, n_test)
        fedcache("store", "import", str(path), "-d", name, "-b", f"synthetic-{name}", "--store", str(store))
        path.unlink()
        fedcache("train", "--store", str(store), "-d", name, "-b", f"synthetic-{name}", *opts, "--rounds", "1")


def render(path: Path = RESULT) -> str:
    """The table of docs/performance.md from a results file: per condition and workload, each arm's threads and
    median time, and the other arms' time over the reference arm's (the policy's, else the first arm's)."""
    doc = json.loads(path.read_text())
    res = doc["result"]
    arms = list(next(iter(next(iter(res["runs"].values())).values())))
    ref = "policy" if "policy" in arms else arms[0]
    others = [a for a in arms if a != ref]
    lines = [f"| condition | workload | {' | '.join(f'{a}: threads, median s' for a in arms)} | "
             f"{' | '.join(f'{a} / {ref} (per trial)' for a in others)} | other busy cores | same final state |",
             "|---" * (4 + len(arms) + len(others)) + "|"]
    for condition, by_workload in res["runs"].items():
        for name, by_arm in by_workload.items():
            cells = [f"{','.join(str(t) for t in sorted({r['threads'] for r in by_arm[a]}))}, "
                     f"{statistics.median(r['wall_seconds'] for r in by_arm[a]):.2f}" for a in arms]
            ratios = [_ratios([r["wall_seconds"] for r in by_arm[a]], [r["wall_seconds"] for r in by_arm[ref]]) for a in others]
            bg = [r["background_cores"] for rs in by_arm.values() for r in rs if r["background_cores"] is not None]
            same = res["same_final_state"][condition][name]
            lines.append(f"| {condition} | {name} | {' | '.join(cells)} | {' | '.join(ratios)} | "
                         f"{min(bg, default=0):.2f}-{max(bg, default=0):.2f} | {'yes' if all(same) else 'NO'} |")
    loaded = f"loaded: {doc['load_processes']} spinning processes; " if "loaded" in res["runs"] else ""
    note = (f"torch's default here: {res['torch_default_threads']} threads; {loaded}{doc['trials']} trials; "
            f"{doc['meta']['cpus']} cores; {doc['meta']['when'][:10]}")
    return "\n".join(lines) + "\n\n" + note


def _ratios(a: list[float], b: list[float]) -> str:
    per = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(per):.2f}x ({', '.join(f'{v:.2f}' for v in per)})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--only", default=None, help="Comma-separated workloads (default: all).")
    p.add_argument("--arms", default="policy,default", help="Comma-separated: policy, default, one.")
    p.add_argument("--conditions", default="idle,loaded", help="Comma-separated: idle, loaded.")
    p.add_argument("--load", type=int, default=(os.cpu_count() or 1) + 1,
                   help="Busy processes of the loaded condition (default: one more than the cores).")
    p.add_argument("--load-seconds", type=float, default=1800, help="The most any busy process spins.")
    p.add_argument("--settle", type=float, default=2.0, help="Seconds between starting the load and the first loaded run.")
    p.add_argument("--quiet-below", type=float, default=0.5,
                   help="Idle runs wait until the machine's busy cores (other work) fall below this ...")
    p.add_argument("--quiet-wait", type=float, default=600, help="... for at most this many seconds each.")
    p.add_argument("--store", type=Path, default=None, help="Keep the imported features here (default: a temporary store).")
    p.add_argument("--tiny", action="store_true", help="Tiny shapes, one trial, one busy process, no waiting: the smoke test.")
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--render", action="store_true", help="Print the markdown table of --out and exit.")
    a = p.parse_args(argv)
    if a.render:
        print(render(a.out))
        return
    if a.tiny:
        a.trials, a.load, a.settle, a.quiet_wait = 1, 1, 0.0, 0.0
    table = TINY if a.tiny else WORKLOADS
    names = a.only.split(",") if a.only else list(table)
    workloads = {n: table[n] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or Path(tmp) / "store.zarr"
        prepare(store, workloads, Path(tmp))
        result = measure(workloads, store, a.trials, a.arms.split(","), a.load, a.load_seconds, a.settle,
                         (a.quiet_below, a.quiet_wait), Path(tmp), a.conditions.split(","))
    write({"description": __doc__.split("\n")[0], "command": "benchmarks/threads.py " + " ".join(argv or sys.argv[1:]),
           "workloads": {n: {"dim": w[0], "train_rows": w[1], "test_rows": w[2], "train_options": w[3]} for n, w in workloads.items()},
           "trials": a.trials, "load_processes": a.load, "quiet_below_cores": a.quiet_below, "result": result}, a.out)


if __name__ == "__main__":
    main()
