"""The `fedcache` command's exit: its objects frozen as it returns, against the same command with Python's last
garbage collections walking them (every object torch's import made).

Whole `fedcache train` processes as users run them, the two arms alternating: a short run (its wall time, and the
seconds from its last line to its exit) and a long run stopped by SIGTERM once its rounds have started (the seconds
from the signal to its exit). The arm without freezing is the same command with ``gc.freeze`` made a no-op in its
process before it starts.

    .venv/bin/python benchmarks/command_exit.py [--store PATH] [--trials 8]
"""
from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import features, stored, write  # noqa: E402
from _runs import child_env, fedcache  # noqa: E402
from threads import write_features  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "command_exit.json"
DATA = ("digits5-offline", "efficientnet-lite0")
TINY_DATA = ("exit-tiny", "synthetic-exit")  # imported: made in a second, where an extraction takes a minute
RUN = ["-m", "fedavg", "--partition", "domain", "--clients", "5", "--few-shot", "10"]
TINY_RUN = ["-m", "fedavg", "--partition", "iid", "--clients", "2"]
# The command's own entry point, with gc.freeze a no-op where the arm says so.
CHILD = ("import gc, sys\n"
         "if sys.argv[1] == 'no-freeze':\n"
         "    gc.freeze = lambda: None\n"
         "sys.argv = ['fedcache', *sys.argv[2:]]\n"
         "from fedcache._console import main\n"
         "main()\n")
ARMS = ("freeze", "no-freeze")


def _start(arm: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, arm, "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env(FEDCACHE_LOG="warning"))


def short_run(arm: str, args: list[str]) -> dict:
    """A whole run: wall seconds, and seconds from its last line (the result) to its exit."""
    t0 = time.perf_counter()
    proc = _start(arm, args)
    last = t0
    for _ in proc.stdout:
        last = time.perf_counter()
    code = proc.wait()
    end = time.perf_counter()
    if code:
        raise RuntimeError(f"{arm}: train exited {code}")
    return {"wall_seconds": round(end - t0, 3), "last_line_to_exit": round(end - last, 3)}


def stopped_run(arm: str, args: list[str]) -> float:
    """Seconds from SIGTERM, sent once the run's rounds have started, to its exit (143)."""
    proc = _start(arm, args)
    for line in proc.stdout:
        if " rounds " in line:  # the progress's first line: the data is read and the rounds run
            break
    time.sleep(0.5)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.stdout.read()
    code = proc.wait()
    if code != 128 + signal.SIGTERM:
        raise RuntimeError(f"{arm}: a stopped train exited {code}")
    return round(time.perf_counter() - sent, 3)


def measure(store: Path, data: tuple[str, str], run: list[str], trials: int, rounds: int) -> dict:
    common = ["--store", str(store), "-d", data[0], "-b", data[1], *run]
    short_run("freeze", [*common, "--rounds", str(rounds)])  # the partition made and the features cached first
    runs: dict[str, list] = {arm: [] for arm in ARMS}
    stops: dict[str, list] = {arm: [] for arm in ARMS}
    for t in range(trials):
        for arm in ARMS if t % 2 == 0 else ARMS[::-1]:
            runs[arm].append(short_run(arm, [*common, "--rounds", str(rounds)]))
            stops[arm].append(stopped_run(arm, [*common, "--rounds", "1000000"]))
    med = {arm: {"wall_seconds": round(statistics.median(r["wall_seconds"] for r in runs[arm]), 3),
                 "last_line_to_exit": round(statistics.median(r["last_line_to_exit"] for r in runs[arm]), 3),
                 "sigterm_to_exit": round(statistics.median(stops[arm]), 3)} for arm in ARMS}
    return {"runs": runs, "sigterm_to_exit": stops, "median": med,
            "freeze_over_no_freeze": {k: round(med["freeze"][k] / med["no-freeze"][k], 2) for k in med["freeze"]}}


def prepare(store: Path, data: tuple[str, str], tiny: bool) -> None:
    if not tiny:
        features(store, data)
    elif not stored(store, data):
        path = store.parent / "exit-tiny.npz"
        write_features(path, 16, 200, 100)
        fedcache("store", "import", str(path), "-d", data[0], "-b", data[1], "--store", str(store))
        path.unlink()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=Path("/tmp/grid-speed-store.zarr"))
    ap.add_argument("--trials", type=int, default=8, help="alternating pairs of each workload")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the short run")
    ap.add_argument("--tiny", action="store_true", help="test-toy data: checks the script, measures nothing")
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args(argv)
    data, run = (TINY_DATA, TINY_RUN) if a.tiny else (DATA, RUN)
    prepare(a.store, data, a.tiny)
    res = {"what": __doc__.split("\n\n")[0], "result": measure(a.store, data, run, a.trials, a.rounds),
           "command": "benchmarks/command_exit.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    write(res, a.out)


if __name__ == "__main__":
    main()
