"""What a library call could change in the process that calls it, as one comparable snapshot.

The library changes nothing process-wide (only the `fedcache` command owns its process): tests take a snapshot,
call the library, take another and compare. Each probe reads one piece of state through a public API; the
children, threads and open files are read from /proc where the system has it.
"""
from __future__ import annotations

import faulthandler
import gc
import locale
import logging
import multiprocessing
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def _signals() -> dict[str, Any]:
    out = {}
    for s in signal.valid_signals():
        try:
            out[str(s)] = signal.getsignal(s)
        except (ValueError, OSError):  # not one this platform lets Python read
            continue
    return out


def _loggers() -> dict[str, Any]:
    """Every logger's level, handlers, propagate and disabled flags (a logger made since is new state only when it
    differs from a fresh one: made by ``getLogger`` alone, it changes nothing anyone sees)."""
    fresh = (logging.NOTSET, (), True, False)
    out = {"": (logging.root.level, tuple(logging.root.handlers), logging.root.propagate, logging.root.disabled)}
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            state = (lg.level, tuple(lg.handlers), lg.propagate, lg.disabled)
            if state != fresh:
                out[name] = state
    return out


def _fds() -> dict[str, str]:
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        return {}
    out = {}
    for fd in os.listdir(fd_dir):
        try:
            out[fd] = os.readlink(fd_dir / fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return out


def _children() -> list[int]:
    """Processes whose parent is this one (Linux), and multiprocessing's children."""
    me, kids = os.getpid(), {p.pid for p in multiprocessing.active_children()}
    for task in Path(f"/proc/{me}/task").glob("*/children") if Path("/proc").is_dir() else []:
        try:
            kids.update(int(p) for p in task.read_text().split())
        except OSError:
            continue
    return sorted(kids)


def _matplotlib() -> Any:
    """The backend and rcParams, where matplotlib is imported (reading them imports nothing, resolves nothing)."""
    mpl = sys.modules.get("matplotlib")
    if mpl is None:
        return None
    params = {k: repr(dict.__getitem__(mpl.rcParams, k)) for k in mpl.rcParams}
    plt = sys.modules.get("matplotlib.pyplot")
    return params, tuple(plt.get_fignums()) if plt is not None else ()


def _torch() -> dict[str, Any]:
    b = torch.backends
    return {
        "threads": torch.get_num_threads(), "interop threads": torch.get_num_interop_threads(),
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "default dtype": torch.get_default_dtype(), "rng": torch.get_rng_state().numpy().tobytes(),
        "grad": torch.is_grad_enabled(), "inference mode": torch.is_inference_mode_enabled(),
        "anomaly": torch.is_anomaly_enabled(), "matmul precision": torch.get_float32_matmul_precision(),
        "cudnn": (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic, b.cudnn.allow_tf32),
        "cuda matmul": (b.cuda.matmul.allow_tf32, b.cuda.matmul.allow_fp16_reduced_precision_reduction),
        "mkldnn": b.mkldnn.enabled, "sharing strategy": torch.multiprocessing.get_sharing_strategy(),
        "default device": torch.get_default_device() if hasattr(torch, "get_default_device") else None,
        "cuda rng": [t.numpy().tobytes() for t in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else None,
    }


def _numpy() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"rng": (kind, keys.tobytes(), pos, has_gauss, gauss), "errors": np.geterr(),
            "print": repr(sorted(np.get_printoptions().items()))}


# name -> what it reads. A name, not a branch: a new piece of state is one line here.
PROBES: dict[str, Callable[[], Any]] = {
    "torch": _torch,
    "numpy": _numpy,
    "random": random.getstate,
    "matplotlib": _matplotlib,
    "loggers": _loggers,
    "logging.disable": lambda: logging.root.manager.disable,
    "logger class": logging.getLoggerClass,
    "warnings.filters": lambda: list(warnings.filters),
    "warnings.showwarning": lambda: warnings.showwarning,  # logging.captureWarnings replaces it
    "signals": _signals,
    "environ": lambda: dict(os.environ),
    "cwd": os.getcwd,
    "umask": _umask,
    "sys.path": lambda: list(sys.path),
    "sys.meta_path": lambda: list(sys.meta_path),
    "hooks": lambda: (sys.excepthook, threading.excepthook, sys.unraisablehook, sys.displayhook, sys.breakpointhook),
    "trace": lambda: (sys.gettrace(), sys.getprofile()),
    "streams": lambda: (sys.stdin, sys.stdout, sys.stderr),
    "recursion limit": sys.getrecursionlimit,
    "switch interval": sys.getswitchinterval,
    "gc": lambda: (gc.isenabled(), gc.get_threshold()),
    "locale": lambda: locale.setlocale(locale.LC_ALL, None),
    "socket timeout": socket.getdefaulttimeout,
    "tempfile.tempdir": lambda: tempfile.tempdir,
    "faulthandler": faulthandler.is_enabled,
    "start method": lambda: multiprocessing.get_start_method(allow_none=True),
    "threads": lambda: sorted(t.name for t in threading.enumerate()),
    "children": _children,
    "open files": _fds,
}


def snapshot() -> dict[str, Any]:
    return {name: read() for name, read in PROBES.items()}


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """name -> (before, after) for each piece of state that differs; dicts name only their keys that differ."""
    out = {}
    for name in before:
        a, b = before[name], after[name]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted({*a, *b}, key=str)
            out[name] = {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}
        else:
            out[name] = (a, b)
    return out


# ---- the library's main entry points, once each on a tiny store, in a process of their own -------------------
# `python -m tests.process_state WORKDIR` prints what they changed (tests/test_api.py). A process of its own:
# torch installs its SIGCHLD handler and multiprocessing fixes its start method once per process, so in a
# process where an earlier test did either, a call that does it again shows nothing.
def _prime(workdir: Path) -> None:
    """What dependencies set up once for the process's life, done before the first snapshot: zarr's I/O thread
    and event loop, matplotlib's font files, tempfile's cached directory. They are theirs, not a call's."""
    import matplotlib.pyplot as plt
    import zarr

    zarr.open_group(store=str(workdir / "prime.zarr"), mode="w").create_array("a", data=np.arange(4))[:]
    fig = plt.figure()
    fig.text(0.5, 0.5, "x")
    fig.savefig(workdir / "prime.png")
    plt.close(fig)
    tempfile.gettempdir()


def _calls(workdir: Path) -> None:
    import fedcache
    from fedcache.store.feature_store import FeatureStore
    from tests.conftest import BACKBONE, TOY  # registered before the first snapshot, in main()

    store, on = workdir / "store.zarr", dict(dataset=TOY, backbones=BACKBONE)
    fedcache.extract_features(TOY, [BACKBONE], store=store, workers=1, batch_size=4)  # workers: a DataLoader's
    fedcache.train(store=store, **on, method="fedavg", partition="domain", rounds=2, out=workdir / "run")
    # scikit-learn's first import (a probe's) pulls in rich, which draws from Python's random
    fedcache.train(store=store, **on, method="linear-probe", partition="domain", rounds=1, out=workdir / "probe")
    fedcache.grid(store=store, **on, methods="fedavg,fedproto", sweep={"partition": "domain", "rounds": 2},
                  seeds=[0], out=workdir / "grid")
    fedcache.report(workdir / "grid")
    FeatureStore(store).read(TOY, "train", BACKBONE)


def _threads_of_dependencies(state: dict[str, Any]) -> dict[str, Any]:
    """zarr runs its reads and writes on an event loop whose executor grows a thread at a time as work needs it,
    for the process's life: its threads are left out by name."""
    ours = [t for t in state["threads"] if not (t.startswith("asyncio_") or t == "zarr_io")]
    return {**state, "threads": ours}


def main(workdir: Path) -> dict[str, Any]:
    # Imported first: importing timm sets TORCHINDUCTOR_CACHE_DIR and makes that folder in the temporary directory
    # (torch's inductor), huggingface_hub gives its logger a handler. Their imports, not fedcache's calls.
    import timm  # noqa: F401
    # scikit-learn's import sets KMP_* variables for Intel's OpenMP, SciPy's adds warning filters; a probe's
    # estimators also pull in rich, which draws from Python's random: fedcache gives that back (borrowed.py).
    import scipy.special  # noqa: F401
    import sklearn  # noqa: F401

    import fedcache.api  # noqa: F401
    import tests.conftest  # noqa: F401  (the tiny dataset, and the environment the tests run in)

    cwd = workdir / "cwd"
    cwd.mkdir()
    os.chdir(cwd)
    _prime(workdir)
    before, temporary = _threads_of_dependencies(snapshot()), set(Path(tempfile.gettempdir()).iterdir())
    _calls(workdir)
    after = _threads_of_dependencies(snapshot())
    left = sorted(str(p) for p in [*cwd.iterdir(), *Path(tempfile.gettempdir()).iterdir()] if p not in temporary)
    return {**{k: repr(v) for k, v in changes(before, after).items()}, **({"files left": left} if left else {})}


if __name__ == "__main__":
    print(repr(main(Path(sys.argv[1]))))
