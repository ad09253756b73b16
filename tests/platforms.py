"""Which platform a test's exact numbers belong to: float arithmetic rounds differently from one torch build, CPU
instruction set or CPU to another (an AMD EPYC rounded otherwise than the CPU of the first records, both AVX-512),
so exact records are kept per platform and CPU."""
from __future__ import annotations

import platform
from pathlib import Path


def platform_id() -> str:
    import torch

    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {platform.machine()}"


def cpu_name() -> str:
    """The CPU's model name as Linux reports it (a virtual machine may shorten it, e.g. "AMD EPYC")."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    return next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "unknown CPU")


def record_key() -> str:
    """This machine's key among records: ``platform | cpu``."""
    return f"{platform_id()} | {cpu_name()}"


def records_of(records: dict, pid: str) -> dict:
    """A platform's records: keyed ``pid | cpu``, or ``pid`` alone (made before records named their CPU)."""
    return {k: v for k, v in records.items() if k == pid or k.startswith(pid + " | ")}
