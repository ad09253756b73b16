"""At the scale users bring: a million rows imported, read, trained on, and a federation of up to 100,000 clients.

Synthetic CLIP-like features (1,000,000 x 512 float32 training rows, 100,000 test rows, 100 classes; ``--large``:
1,300,000 x 1024) are written to an uncompressed .npz and imported through the public path
(`fedcache store import`, a child process). Then, in one run, each figure a ratio against a reference measured
beside it:

- read: `FeatureStore.read` of the training entry (checked chunk by chunk, then memory-mapped) and the copying
  read (`load_fused` into a new array, what several domains, fused backbones or float16 entries take), each over
  copying the same bytes out of a memory-mapped .npy in the page cache, interleaved (--trials of each); and a
  format-1 entry (zstd, read through Zarr: what stores written before format 2 hold) against the same copy;
- write: `import` throughput (features' bytes / wall time of the child process), and the extraction writer alone
  (`EntryWriter.write_chunk` of in-memory rows, float32 and float16) into the store's disk and into /dev/shm;
- train: `fedcache train -m fedavg --partition dirichlet --alpha 0.3 --clients 10000 --fraction 0.01 --rounds 10
  --threads CORES` (a child process, twice: the first run makes and stores the partition, the second reads it
  back): setup (all before the first round: reading, partition, method) over its ten rounds, and its peak RSS over
  the features' bytes (with the RSS the process had before reading anything, and its peak anonymous memory);
- clients: a round of FedAvg with 10 clients sampled out of 100 ... 100,000 (IID partition, one process, the
  features read once): a round without evaluation, and the evaluation of every client's local test rows.

    .venv/bin/python benchmarks/scale.py [--trials 4] [--work DIR] [--out benchmarks/results/scale.json]
    .venv/bin/python benchmarks/scale.py --large --out benchmarks/results/scale_large.json
    .venv/bin/python benchmarks/scale.py --tiny --out /tmp/s.json      # seconds: a smoke run
    .venv/bin/python benchmarks/scale.py --render                      # the section of docs/performance.md
    .venv/bin/python benchmarks/scale.py --from-store feats.zarr -d digits5-offline -b efficientnet-lite0 \
        --out benchmarks/results/scale_from_store.json   # real features: zstd's saving, format-1 vs format-2 reads
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULT = Path(__file__).resolve().parent / "results" / "scale.json"
SIZES = {
    "default": {"rows": 1_000_000, "dim": 512, "test_rows": 100_000, "classes": 100, "clients": [100, 1000, 10_000, 100_000],
                "train_clients": 10_000},
    "large": {"rows": 1_300_000, "dim": 1024, "test_rows": 100_000, "classes": 100, "clients": [100, 1000, 10_000, 100_000],
              "train_clients": 10_000},
    "tiny": {"rows": 6000, "dim": 16, "test_rows": 600, "classes": 10, "clients": [10, 100, 1000], "train_clients": 100},
}
DATASET, BACKBONE = "scale", "synthetic"
SAMPLED = 10  # clients per round in the client sweep
SWEEP_ROUNDS = 6
WRITER_BYTES = 2 << 30  # the writer is timed on at most this much of the features (it also writes into RAM)


# ---- data -----------------------------------------------------------------------------------------
def write_npz(path: Path, rows: int, dim: int, test_rows: int, classes: int, seed: int = 0, block: int = 65536) -> None:
    """An uncompressed .npz (np.savez layout) written a block of rows at a time: class centres plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for split, n in (("train", rows), ("test", test_rows)):
            labels = rng.integers(0, classes, n)
            with zf.open(f"{split}__features.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array_header_2_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (n, dim)})
                for lo in range(0, n, block):
                    y = labels[lo:lo + block]
                    fh.write((centres[y] + 2 * rng.standard_normal((len(y), dim), dtype=np.float32)).tobytes())
            with zf.open(f"{split}__labels.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, labels)
        with zf.open("classes.npy", "w") as fh:
            np.lib.format.write_array(fh, np.array(json.dumps([f"class{c}" for c in range(classes)])))


# ---- child processes: wall time, peak RSS, peak anonymous memory ----------------------------------
CHILD = """
import json, sys, threading, time
sys.path.insert(0, {repo!r})
import torch  # noqa: F401  (train imports it; its libraries are part of the baseline, not of the run)
import fedcache.training  # noqa: F401  (module imports are the process's start, not the run's setup)
from fedcache.cli import main
def status():
    return {{k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
            if k in ("VmRSS", "VmHWM", "RssAnon")}}
base, peak_anon, stop = status(), [0], threading.Event()
def sample():
    while not stop.wait(0.01):
        peak_anon[0] = max(peak_anon[0], status()["RssAnon"])
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
code = main({args!r})
wall = time.perf_counter() - t0
stop.set()
end = status()
print("CHILD " + json.dumps({{"code": code, "wall_s": wall, "rss_before_bytes": base["VmRSS"], "anon_before_bytes": base["RssAnon"],
                            "peak_rss_bytes": end["VmHWM"],
                            "peak_anon_bytes": max(peak_anon[0], end["RssAnon"])}}))
"""


def child(args: list[str], cwd: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), args=args)], cwd=cwd, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{args[:3]} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][6:])


# ---- read -----------------------------------------------------------------------------------------
def copy_out_of_page_cache(npy: Path) -> float:
    m = np.load(npy, mmap_mode="r")
    t0 = time.perf_counter()
    x = np.array(m)
    dt = time.perf_counter() - t0
    del x
    return dt


def timed(fn) -> float:
    t0 = time.perf_counter()
    x = fn()
    dt = time.perf_counter() - t0
    del x
    return dt


def interleaved(arms: dict, trials: int, nbytes: int) -> dict[str, list[float]]:
    """Each arm timed ``trials`` times, the order reversed every other trial. Before each timing the same number
    of bytes is allocated, touched and freed: on a virtual machine a fresh allocation may wait for the host to
    back its pages, and how long depends on what ran just before, which would otherwise favour the first arm."""
    for fn in arms.values():  # warm the page cache, the imports and this process's memory
        fn()
    times: dict[str, list[float]] = {k: [] for k in arms}
    for t in range(trials):
        for name in (list(arms) if t % 2 == 0 else list(arms)[::-1]):
            np.ones(nbytes, np.uint8)
            times[name].append(arms[name]())
    return times


def ratios(arm: list[float], ref: list[float]) -> dict:
    per = [a / r for a, r in zip(arm, ref)]
    return {"median_ratio": round(statistics.median(per), 3), "min": round(min(per), 3), "max": round(max(per), 3),
            "best_over_best": round(min(arm) / min(ref), 3)}


def measure_read(store_path: Path, work: Path, trials: int) -> dict:
    from fedcache.federate.tables import load_fused
    from fedcache.store.feature_store import FeatureStore

    store = FeatureStore(store_path, create=False)
    table = store.read(DATASET, "train", BACKBONE)
    npy = work / "train_features.npy"
    np.save(npy, table.features)
    nbytes = table.features.nbytes
    del table
    arms = {
        "page_cache_copy": lambda: copy_out_of_page_cache(npy),
        "store_read": lambda: timed(lambda: FeatureStore(store_path, create=False).read(DATASET, "train", BACKBONE)),
        "store_read_copying": lambda: timed(lambda: load_fused(FeatureStore(store_path, create=False), DATASET, [BACKBONE],
                                                               "train", alloc=lambda shape: np.empty(shape, np.float32))),
    }
    times = interleaved(arms, trials, nbytes)
    ref = times["page_cache_copy"]
    return {"bytes": nbytes, "seconds": {k: [round(v, 4) for v in vs] for k, vs in times.items()},
            "store_read_over_page_cache_copy": ratios(times["store_read"], ref),
            "copying_read_over_page_cache_copy": ratios(times["store_read_copying"], ref)}


def measure_mapping(store_path: Path, share: float = 0.01) -> dict:
    """How much of the mapped features a process's RSS counts after it touches ``share`` of the rows at random (what
    one round of 10,000 clients at 1% touches): the kernel maps the page cache's pages around each row touched
    (large folios), so RSS can count every page of the features while a run reads a few of them."""
    from fedcache.store.feature_store import FeatureStore

    def rss_file() -> int:
        return next(int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("RssFile:"))

    from fedcache.store import mapping

    table = FeatureStore(store_path, create=False).read(DATASET, "train", BACKBONE)
    n = len(table.features)
    rows = np.sort(np.random.default_rng(0).choice(n, max(1, int(share * n)), replace=False))
    before = rss_file()
    gathered = mapping.gather(table.features, rows)  # what training reads rows with: a region mapped at a time
    gather_grown = rss_file() - before
    before = rss_file()  # the gather's last region may still be mapped
    touched = table.features[rows]
    grown = rss_file() - before
    return {"rows_touched": len(touched), "bytes_of_rows_touched": int(touched.nbytes), "feature_bytes": int(table.features.nbytes),
            "rss_file_growth_bytes": grown, "rss_growth_over_features": round(grown / table.features.nbytes, 3),
            "gather_rss_file_growth_bytes": gather_grown,
            "gather_rss_growth_over_features": round(gather_grown / table.features.nbytes, 3),
            "same_rows": bool(np.array_equal(gathered, touched))}


def measure_format_1_read(store_path: Path, work: Path, trials: int) -> dict:
    """The test split written again as a format-1 entry (zstd, Zarr's default codec), read against the same copy."""
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.keys import EntryKey
    from fedcache.store.writer import open_writer

    store = FeatureStore(store_path, create=False)
    t = store.read(DATASET, "test", BACKBONE)
    key = EntryKey("scale-format-1", "synthetic", "test", "all", BACKBONE, "w", {"synthetic": True}, dtype="float32")
    attrs = {"classes": list(t.class_names), "domains": ["all"], "random_weights": False}
    with open_writer(store, key, len(t), t.features.shape[1], 1, attrs, entry_format=1) as w:
        for c in w.pending():
            lo, hi = w.chunk_range(c)
            w.write_chunk(c, t.features[lo:hi], t.labels[lo:hi], t.ids[lo:hi], np.ones(hi - lo, bool))
        w.finish([])
    npy = work / "test_features.npy"
    np.save(npy, t.features)
    arms = {"page_cache_copy": lambda: copy_out_of_page_cache(npy),
            "format_2_read": lambda: timed(lambda: FeatureStore(store_path, create=False).read(DATASET, "test", BACKBONE)),
            "format_1_read": lambda: timed(lambda: FeatureStore(store_path, create=False).read("scale-format-1", "test", BACKBONE))}
    times = interleaved(arms, trials, t.features.nbytes)
    store.remove(key.entry_id)
    ref = times["page_cache_copy"]
    return {"bytes": t.features.nbytes, "seconds": {k: [round(v, 4) for v in vs] for k, vs in times.items()},
            "format_2_read_over_page_cache_copy": ratios(times["format_2_read"], ref),
            "format_1_read_over_page_cache_copy": ratios(times["format_1_read"], ref)}


# ---- write ----------------------------------------------------------------------------------------
def measure_writer(store_path: Path, where: dict[str, Path]) -> dict:
    """The extraction writer alone: rows already in memory (as a GPU batch would be) written chunk by chunk."""
    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.keys import EntryKey
    from fedcache.store.writer import open_writer

    t = FeatureStore(store_path, create=False).read(DATASET, "train", BACKBONE)
    n = min(len(t), WRITER_BYTES // t.features[0].nbytes)
    x = np.array(t.features[:n])  # in memory (as a GPU's output is), not the page cache's mapping
    labels, ids, ok = t.labels[:n], t.ids[:n], np.ones(n, bool)
    out = {}
    for place, folder in where.items():
        for dtype in ("float32", "float16"):
            path = folder / "writer.zarr"
            shutil.rmtree(path, ignore_errors=True)
            store = FeatureStore(path)
            key = EntryKey("w", "fp", "train", "all", "bb", "w", {"s": 1}, dtype=dtype)
            t0 = time.perf_counter()
            with open_writer(store, key, len(x), x.shape[1], 64, {"classes": ["a"], "domains": ["all"]}) as w:
                for c in w.pending():
                    lo, hi = w.chunk_range(c)
                    w.write_chunk(c, x[lo:hi], labels[lo:hi], ids[lo:hi], ok[lo:hi])
                w.finish([])
            dt = time.perf_counter() - t0
            shutil.rmtree(path)
            stored = x.shape[0] * x.shape[1] * np.dtype(dtype).itemsize
            out[f"{place}_{dtype}"] = {"seconds": round(dt, 3), "GB_per_s_stored": round(stored / dt / 1e9, 3),
                                       "GB_per_s_float32_given": round(x.nbytes / dt / 1e9, 3),
                                       "rows_per_s": round(len(x) / dt)}
    return out


# ---- train ----------------------------------------------------------------------------------------
def measure_train(store_path: Path, work: Path, clients: int, feature_bytes: int) -> dict:
    # --threads as many as the cores: what the command chooses on an idle machine, without the quarter second it
    # watches the machine to choose, which a real command spends importing torch (imported here before timing).
    args = ["train", "--store", str(store_path), "-d", DATASET, "-b", BACKBONE, "-m", "fedavg", "--partition", "dirichlet",
            "--alpha", "0.3", "--clients", str(clients), "--fraction", "0.01", "--rounds", "10",
            "--threads", str(len(os.sched_getaffinity(0)))]
    out = {"command": "fedcache " + " ".join(args[:1] + ["--store", "STORE"] + args[3:]), "feature_bytes": feature_bytes}
    for name in ("first_run", "repeat_run"):  # the first makes and stores the partition, the second reads it back
        run_dir = work / f"train-{name}"
        r = child(args + ["--out", str(run_dir), "--overwrite"], work)
        rounds = json.loads((run_dir / "summary.json").read_text())["seconds"]
        out[name] = {"wall_s": round(r["wall_s"], 3), "rounds_s": round(rounds, 3), "setup_s": round(r["wall_s"] - rounds, 3),
                     "setup_over_rounds": round((r["wall_s"] - rounds) / rounds, 3),
                     "peak_rss_over_features": round(r["peak_rss_bytes"] / feature_bytes, 3),
                     "peak_rss_above_start_over_features": round((r["peak_rss_bytes"] - r["rss_before_bytes"]) / feature_bytes, 3),
                     "peak_anon_over_features": round(r["peak_anon_bytes"] / feature_bytes, 3),
                     "peak_anon_above_start_over_features": round((r["peak_anon_bytes"] - r["anon_before_bytes"]) / feature_bytes, 3),
                     "rss_before_reading_bytes": r["rss_before_bytes"], "peak_rss_bytes": r["peak_rss_bytes"],
                     "anon_before_reading_bytes": r["anon_before_bytes"], "peak_anon_bytes": r["peak_anon_bytes"]}
    return out


# ---- clients --------------------------------------------------------------------------------------
def measure_clients(store_path: Path, work: Path, counts: list[int]) -> dict:
    """FedAvg, 10 clients a round out of n: setup (partition made), a round (checkpoint written, no evaluation),
    and one evaluation of every client on its local test rows, each timed on its own."""
    from fedcache.federate.tables import load_fused
    from fedcache.federate.driver import RunState
    from fedcache.federate.inprocess import RunConfig, evaluate, run
    from fedcache.training import prepare
    from fedcache.spec import RunSpec
    from fedcache.store.feature_store import FeatureStore

    store = FeatureStore(store_path, create=False)
    tables = tuple(load_fused(store, DATASET, [BACKBONE], s) for s in ("train", "test"))
    out = {}
    for n in counts:
        spec = RunSpec.of(store=store_path, dataset=DATASET, backbones=[BACKBONE], method="fedavg", partition="iid",
                          clients=n, fraction=SAMPLED / n, rounds=SWEEP_ROUNDS)
        t0 = time.perf_counter()
        method, resolved = prepare(spec, tables)
        setup = time.perf_counter() - t0
        folder = work / f"clients-{n}"
        folder.mkdir()
        ticks = [time.perf_counter()]
        result = run(method, RunConfig(SWEEP_ROUNDS, SAMPLED / n, eval_every=SWEEP_ROUNDS + 1, out=folder),
                     lambda done, total, line: ticks.append(time.perf_counter()))
        state = RunState(SWEEP_ROUNDS, result.server, result.clients)
        scoring = []
        for _ in range(3):
            t1 = time.perf_counter()
            evaluate(method, state)
            scoring.append(time.perf_counter() - t1)
        out[str(n)] = {"setup_s": round(setup, 3), "round_s": round(float(np.median(np.diff(ticks)[:-1])), 4),
                       "evaluation_s": round(float(np.median(scoring)), 4),
                       "rows_trained_per_round": int(SAMPLED * len(tables[0]) / n),
                       "local_test_rows": int(sum(resolved["data"]["client_test_sizes"])),
                       "accuracy": round(result.summary["mean_accuracy"], 2)}
        shutil.rmtree(folder, ignore_errors=True)
        del method, result, state
    first, last = out[str(counts[0])], out[str(counts[-1])]
    out["round_at_most_over_fewest"] = round(last["round_s"] / first["round_s"], 3)
    out["round_and_evaluation_at_most_over_fewest"] = round((last["round_s"] + last["evaluation_s"])
                                                            / (first["round_s"] + first["evaluation_s"]), 3)
    return out


# ---- a grid ----------------------------------------------------------------------------------------
def tree_pss(root: int) -> list[dict]:
    """Proportional set size (and its anonymous part) of a process and each of its descendants, in bytes: a page
    mapped by k of them counts 1/k in each, so features shared through the page cache count once however many
    workers map them."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            rollup = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
            out.append({k.lower(): 1024 * int(rollup[k].split()[0]) for k in ("Pss", "Pss_Anon")})
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, KeyError, ValueError):  # it ended meanwhile
            continue
    return out


def measure_grid(store_path: Path, work: Path, jobs: tuple[int, ...] = (1, 2)) -> dict:
    """`fedcache grid` (process engine, 4 cells of 2 rounds, 10 of 100 clients a round) with 1 and 2 workers: the
    peak PSS of the grid's processes."""
    out = {}
    for j in jobs:
        args = [sys.executable, "-m", "fedcache.cli", "grid", "--store", str(store_path), "-d", DATASET, "-b", BACKBONE,
                "-m", "fedavg", "--set", "lr=0.01,0.1", "--seeds", "0,1", "--partition", "iid", "--clients", "100",
                "--fraction", "0.1", "--rounds", "2", "--engine", "processes", "-j", str(j), "-o", str(work / f"grid-{j}")]
        proc = subprocess.Popen(args, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        peak, at_peak, t0 = 0, [], time.perf_counter()
        while proc.poll() is None:
            procs = tree_pss(proc.pid)
            if sum(p["pss"] for p in procs) > peak:
                peak, at_peak = sum(p["pss"] for p in procs), procs
            time.sleep(0.05)
        if proc.returncode:
            raise RuntimeError(f"grid -j {j} failed: {proc.stderr.read()[-3000:]}")
        # the processes at the peak, largest first (the grid's own and its workers; small helpers left out)
        big = sorted((p for p in at_peak if p["pss"] > 50e6), key=lambda p: -p["pss"])
        out[f"jobs_{j}"] = {"peak_pss_bytes": peak, "wall_s": round(time.perf_counter() - t0, 2),
                            "processes_at_peak": [{"pss_bytes": p["pss"], "pss_anon_bytes": p["pss_anon"]} for p in big]}
        out["command"] = "fedcache " + " ".join(args[3:-4] + ["-j", "J", "-o", "OUT"]).replace(str(store_path), "STORE")
        shutil.rmtree(work / f"grid-{j}", ignore_errors=True)
    out["peak_pss_jobs_2_over_jobs_1"] = round(out["jobs_2"]["peak_pss_bytes"] / out["jobs_1"]["peak_pss_bytes"], 3)
    return out


# ---- a store of real features --------------------------------------------------------------------------
def measure_from_store(path: Path, dataset: str, backbone: str, work: Path, trials: int) -> dict:
    """Real features: each training entry of (dataset, backbone) in the given store (only read) written again, as
    it is stored, in format 1 (zstd, Zarr's default codec) and in format 2 (uncompressed): the bytes each takes on
    disk, and reading the table from each, interleaved."""
    from numcodecs import Zstd

    from fedcache.store.feature_store import FeatureStore
    from fedcache.store.keys import EntryKey
    from fedcache.store.writer import open_writer

    source = FeatureStore(path, create=False)
    stores = {fmt: FeatureStore(work / f"format-{fmt}.zarr") for fmt in (1, 2)}
    infos = source.find(dataset, "train", backbone)
    dtype = infos[0].key["dtype"]
    for info in infos:
        a = source.read_arrays(info)
        for fmt, store in stores.items():
            with open_writer(store, EntryKey(**info.key), info.n_rows, info.dim, int(info.attrs["batch_size"]),
                             info.attrs, chunk_rows=int(info.attrs["chunk_rows"]), entry_format=fmt) as w:
                for c in w.pending():
                    lo, hi = w.chunk_range(c)
                    w.write_chunk(c, *(a[n][lo:hi] for n in ("features", "labels", "ids", "valid")))
                w.finish([])
    t = stores[2].read(dataset, "train", backbone)
    stored = t.features.astype(dtype).tobytes()
    read = {fmt: lambda s=s: timed(lambda: FeatureStore(s.path, create=False).read(dataset, "train", backbone))
            for fmt, s in stores.items()}
    for fn in read.values():
        fn()
    times: dict[int, list[float]] = {1: [], 2: []}
    for i in range(trials):
        for fmt in ((1, 2) if i % 2 == 0 else (2, 1)):
            times[fmt].append(read[fmt]())
    disk = {f"format_{fmt}": sum(f.stat().st_size for f in (s.path / "entries").rglob("*") if f.is_file())
            for fmt, s in stores.items()}
    return {"dataset": dataset, "backbone": backbone, "rows": len(t), "dim": int(t.features.shape[1]),
            "stored_dtype": dtype,
            "exact_zeros": round(float((t.features == 0).mean()), 3),
            "zstd_level_0_kept": round(len(Zstd(level=0).encode(stored)) / len(stored), 3),
            "entries_bytes_on_disk": disk, "seconds": {f"format_{k}": [round(v, 4) for v in vs] for k, vs in times.items()},
            "format_1_read_over_format_2_read": ratios(times[1], times[2])}


# ---- the run --------------------------------------------------------------------------------------
def measure(size: dict, work: Path, trials: int) -> dict:
    npz, store = work / "features.npz", work / "store.zarr"
    t0 = time.perf_counter()
    write_npz(npz, size["rows"], size["dim"], size["test_rows"], size["classes"])
    res: dict = {"data_written_s": round(time.perf_counter() - t0, 1), "load_average_at_start": os.getloadavg()}
    feature_bytes = 4 * size["dim"] * (size["rows"] + size["test_rows"])
    imp = child(["store", "import", str(npz), "--store", str(store), "--dataset", DATASET, "--backbone", BACKBONE], work)
    res["import"] = {"command": f"fedcache store import features.npz --store STORE --dataset {DATASET} --backbone {BACKBONE}",
                     "wall_s": round(imp["wall_s"], 3), "GB_per_s": round(feature_bytes / imp["wall_s"] / 1e9, 3),
                     "peak_rss_over_features": round(imp["peak_rss_bytes"] / feature_bytes, 3),
                     "peak_anon_over_features": round(imp["peak_anon_bytes"] / feature_bytes, 3),
                     "npz_bytes": npz.stat().st_size}
    npz.unlink()
    res["read"] = measure_read(store, work, trials)
    res["mapping"] = measure_mapping(store)
    res["format_1_read"] = measure_format_1_read(store, work, trials)
    shm = Path("/dev/shm")
    res["writer"] = measure_writer(store, {"disk": work, **({"tmpfs": shm} if shm.is_dir() else {})})
    res["train"] = measure_train(store, work, size["train_clients"], feature_bytes)
    res["clients"] = measure_clients(store, work, size["clients"])
    res["grid"] = measure_grid(store, work)
    res["grid"]["feature_bytes"] = feature_bytes
    res["grid"]["growth_over_features"] = round((res["grid"]["jobs_2"]["peak_pss_bytes"]
                                                 - res["grid"]["jobs_1"]["peak_pss_bytes"]) / feature_bytes, 3)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a few thousand rows: checks the benchmark runs")
    ap.add_argument("--large", action="store_true", help="1,300,000 x 1024 features")
    ap.add_argument("--trials", type=int, default=4, help="an even number puts each arm first as often as last")
    ap.add_argument("--work", type=Path, default=None, help="where the data and the store go (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--render", action="store_true", help="print the markdown section of docs/performance.md")
    ap.add_argument("--from-store", type=Path, default=None, help="a format-1 store of real features (copied, not changed)")
    ap.add_argument("-d", "--dataset", default=None)
    ap.add_argument("-b", "--backbone", default=None)
    args = ap.parse_args(argv)
    if args.render:
        print(render(args.out))
        return {}
    if args.from_store:
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            res = {"what": measure_from_store.__doc__.replace("\n", " "), "trials": args.trials,
                   "result": measure_from_store(args.from_store, args.dataset, args.backbone, Path(tmp), args.trials)}
        write(res, args.out)
        return res
    name = "tiny" if args.tiny else "large" if args.large else "default"
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        res = {"what": __doc__.strip().split("\n\n")[0].replace("\n", " "), "size": {"name": name, **SIZES[name]},
               "trials": args.trials, "result": measure(SIZES[name], Path(tmp), args.trials)}
    write(res, args.out)
    return res


def render(path: Path = RESULT) -> str:
    r = json.loads(Path(path).read_text())
    s, res = r["size"], r["result"]
    rd, f1, tr, cl = res["read"], res["format_1_read"], res["train"], res["clients"]
    gb = rd["bytes"] / 1e9
    lines = [
        f"{s['rows']:,} x {s['dim']} float32 training features ({gb:.2f} GB) and {s['test_rows']:,} test rows, "
        f"{s['classes']} classes; median of {r['trials']} interleaved trials (range in brackets), "
        f"{r['meta']['cpus']} CPUs, load average {r['meta']['load_average_at_end']} at the end. \"features' bytes\" "
        f"are the training and test features' ({res['train']['feature_bytes'] / 1e9:.4g} GB); \"training features' "
        f"bytes\" the training table's alone ({gb:.4g} GB).",
        "",
        "| measured | against | ratio |",
        "|---|---|---|",
        f"| `FeatureStore.read` (checked, memory-mapped) | copying the same bytes out of the page cache | "
        f"**{_r(rd['store_read_over_page_cache_copy'])}** |",
        f"| copying read (into a new array: several domains, fused backbones, float16) | same copy | "
        f"{_r(rd['copying_read_over_page_cache_copy'])} |",
        f"| format-1 entry read ({f1['bytes'] / 1e6:.0f} MB, zstd through Zarr) | copy of the same bytes | "
        f"{_r(f1['format_1_read_over_page_cache_copy'])} |",
        f"| format-2 read of that entry | copy of the same bytes | {_r(f1['format_2_read_over_page_cache_copy'])} |",
        f"| train setup, first run (makes the partition) | its 10 rounds | {tr['first_run']['setup_over_rounds']} "
        f"({tr['first_run']['setup_s']} s / {tr['first_run']['rounds_s']} s) |",
        f"| train setup, repeat run (partition stored) | its 10 rounds | **{tr['repeat_run']['setup_over_rounds']}** "
        f"({tr['repeat_run']['setup_s']} s / {tr['repeat_run']['rounds_s']} s) |",
        f"| train peak RSS | features' bytes | {tr['repeat_run']['peak_rss_over_features']} |",
        f"| train peak RSS above the process's RSS before reading (torch loaded) | features' bytes | "
        f"**{tr['repeat_run']['peak_rss_above_start_over_features']}** |",
        f"| train peak anonymous memory, whole / above the start (the run's own copies and working set) | features' bytes | "
        f"{tr['repeat_run']['peak_anon_over_features']} / {tr['repeat_run'].get('peak_anon_above_start_over_features', '-')} |",
        f"| import peak RSS / peak anonymous memory | features' bytes | {res['import']['peak_rss_over_features']} / "
        f"{res['import']['peak_anon_over_features']} |",
        f"| round, {s['clients'][-1]:,} clients | round, {s['clients'][0]:,} clients (10 sampled each) | "
        f"**{cl['round_at_most_over_fewest']}** |",
        f"| round + evaluation of every client, {s['clients'][-1]:,} clients | the same, {s['clients'][0]:,} clients | "
        f"{cl['round_and_evaluation_at_most_over_fewest']} |",
    ]
    if "grid" in res:
        g = res["grid"]
        lines.append(f"| grid peak PSS, `-j 2` ({g['jobs_2']['peak_pss_bytes'] / 1e9:.2f} GB) | the same grid, `-j 1` "
                     f"({g['jobs_1']['peak_pss_bytes'] / 1e9:.2f} GB) | {g['peak_pss_jobs_2_over_jobs_1']} |")
        lines.append(f"| grid peak PSS, `-j 2` minus `-j 1` | features' bytes | {g['growth_over_features']} |")
        if "processes_at_peak" in g["jobs_1"]:
            gb = lambda p: f"{p['pss_bytes'] / 1e9:.2f} GB ({p['pss_anon_bytes'] / 1e9:.2f} anonymous)"  # noqa: E731
            lines.append("| grid processes at the peak, PSS each | (absolute) | "
                         + "; ".join(f"`-j {j}`: " + ", ".join(gb(p) for p in g[f"jobs_{j}"]["processes_at_peak"]) for j in (1, 2)) + " |")
    if "mapping" in res:
        m = res["mapping"]
        lines.append(f"| RSS counted after touching {m['rows_touched']:,} random rows ({m['bytes_of_rows_touched'] / 1e6:.0f} MB) of the "
                     f"mapped features, indexed | training features' bytes | {m['rss_growth_over_features']} |")
        if "gather_rss_growth_over_features" in m:
            lines.append(f"| the same rows read with `store.mapping.gather` (what training reads with) | training features' bytes | "
                         f"{m['gather_rss_growth_over_features']} |")
    lines += [
        "",
        f"Throughputs (for scale only, not comparable across runs): import {res['import']['GB_per_s']} GB/s of features "
        "(the whole `fedcache store import`, child process). "
        "The extraction writer alone (`write_chunk`, rows in memory): "
        + ", ".join(f"{k.replace('_', ' ')} {v['GB_per_s_stored']} GB/s stored ({v['rows_per_s']:,} rows/s)"
                    for k, v in res["writer"].items()) + ".",
        "",
        "The same run's seconds behind the client rows above (for scale only, not comparable across runs):",
        "",
        "| clients (10 sampled) | rows trained per round | round (s) | evaluation of every client (s) | setup (s) |",
        "|---|---|---|---|---|",
    ]
    for n in s["clients"]:
        c = cl[str(n)]
        lines.append(f"| {n:,} | {c['rows_trained_per_round']:,} | {c['round_s']} | {c['evaluation_s']} | {c['setup_s']} |")
    return "\n".join(lines)


def _r(d: dict) -> str:
    return f"{d['median_ratio']} ({d['min']}-{d['max']})"


if __name__ == "__main__":
    main()
