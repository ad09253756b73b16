"""The allocator tuning: applied once, skipped when the user chose their own settings."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = "from fedcache.federate.memory import keep_freed_memory as k; print(k(), k())"


def _probe(env: dict) -> list[str]:
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tuning is Linux-only")
def test_applied_once_and_respects_user_settings():
    base = {k: v for k, v in os.environ.items() if k not in ("FEDCACHE_MALLOC", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                                                             "MALLOC_TRIM_THRESHOLD_")}
    if platform.libc_ver()[0] == "glibc":
        assert _probe(base) == ["True", "True"]
    assert _probe({**base, "FEDCACHE_MALLOC": "system"}) == ["False", "False"]
    assert _probe({**base, "MALLOC_TRIM_THRESHOLD_": "131072"}) == ["False", "False"]
