"""What every benchmark records beside its numbers, and how it writes them."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def meta() -> dict:
    """The machine facts that change timings: torch build and threads, cores, OMP setting, when."""
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version(),
            "load_average_at_end": round(os.getloadavg()[0], 2), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}


def write(res: dict, out: Path) -> None:
    res["meta"] = meta()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
