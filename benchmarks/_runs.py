"""Whole `fedcache` processes as users run them, timed, with what the rest of the machine was doing meanwhile."""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THREADS_LINE = re.compile(r"torch threads: (\d+)")
# train's last line: `fedavg: 61.58% mean over clients (std 15.93), ...; 50 rounds in 3.21s`
RESULT_LINE = re.compile(r": ([0-9.]+)% mean over clients \(std [0-9.]+\).*; (\d+) rounds? in ([0-9.]+)s")


def child_env(**extra: str) -> dict:
    """This checkout's fedcache first on the path; no OMP_NUM_THREADS unless ``extra`` sets one; INFO records on
    (the command says its thread choice there, and nothing in the rounds logs at INFO)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["FEDCACHE_LOG"] = "info"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**env, **extra}


def fedcache(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "fedcache.cli", *args], env=env or child_env(), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"fedcache {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def busy_seconds() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (Linux), or None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def busy_cores_now(seconds: float = 1.0) -> float | None:
    b0 = busy_seconds()
    time.sleep(seconds)
    return None if b0 is None else (busy_seconds() - b0) / seconds


def wait_for_quiet(below: float, longest: float) -> float:
    """Seconds waited (at most ``longest``) until the machine's busy cores, over one second, fall below ``below``:
    a run meant for an idle machine starts once other work has left it alone, where the machine allows it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < longest:
        now = busy_cores_now()
        if now is None or now < below:
            break
    return round(time.monotonic() - t0, 1)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_train(args: list[str], env: dict | None = None) -> dict:
    """One whole `fedcache train` process: wall seconds from start to exit, the CPU it used, the threads it said it
    trained with, its rounds and their seconds (the summary's), its mean accuracy, and the cores the rest of the
    machine kept busy meanwhile (`background_cores`; None where /proc/stat is missing)."""
    busy0, cpu0 = busy_seconds(), _children_cpu()
    t0 = time.perf_counter()
    done = fedcache("train", *args, env=env)
    wall = time.perf_counter() - t0
    busy1, cpu = busy_seconds(), _children_cpu() - cpu0
    said, result = THREADS_LINE.search(done.stderr + done.stdout), RESULT_LINE.search(done.stdout)
    rounds, seconds = (int(result.group(2)), float(result.group(3))) if result else (None, None)
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), "threads": int(said.group(1)) if said else None,
            "rounds": rounds, "rounds_seconds": seconds,
            "rounds_per_second": round(rounds / seconds, 1) if rounds and seconds else None,
            "mean_accuracy": float(result.group(1)) if result else None,
            "background_cores": None if busy0 is None else round(max(0.0, (busy1 - busy0 - cpu) / wall), 2)}
