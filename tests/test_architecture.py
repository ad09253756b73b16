"""docs/architecture.md's "how to add" steps work as written: each code block runs, in a fresh process (the
registries it fills stay out of the other tests), and does what the page says."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"


def block(heading: str) -> str:
    """The first python code block under ``## heading``."""
    text = PAGE.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


RUNS = """
import torch
from tests.federate.conftest import synthetic
from fedcache.federate.inprocess import RunConfig, run
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim_config import OptimConfig
from fedcache.federate.schedule import Schedule
torch.set_num_threads(1)

def one(name, rounds=8, fraction=1.0, **settings):
    data = synthetic(n_clients=4, per_client=60)
    cls = METHODS.get(name)
    ctx = MethodContext(data, "linear", OptimConfig("sgd", 0.05, 0.0, 0.0), Schedule(local_epochs=1, batch_size=16))
    return run(cls(ctx, cls.Settings(**settings)), RunConfig(rounds=rounds, fraction=fraction))
"""


def test_the_example_method_registers_learns_and_is_fedavg_without_momentum():
    out = run(block("How to add a method") + RUNS + textwrap.dedent("""
        from fedcache.spec import RunSpec
        spec = RunSpec.of(dataset="d", backbones="b", method="example-fedavgm", settings=["server_momentum=0.5"])
        assert spec.method.params.server_momentum == 0.5
        learned = one("example-fedavgm", server_momentum=0.5)
        plain, still = one("fedavg"), one("example-fedavgm", server_momentum=0.0)
        close = all(torch.allclose(still.server[n], plain.server[n], atol=1e-6) for n in plain.server)
        import json
        print(json.dumps({"accuracy": learned.summary["mean_accuracy"], "fedavg_without_momentum": close,
                          "server": sorted(still.server), "bytes_down": [learned.summary["bytes_down"], plain.summary["bytes_down"]]}))
    """))
    got = json.loads(out)
    assert got["accuracy"] > 80 and got["fedavg_without_momentum"]
    assert "v.weight" in got["server"] and got["bytes_down"][0] == got["bytes_down"][1]  # the momentum never travels


def test_the_example_partition_scheme_deals_every_row_once():
    out = run(block("How to add a partition scheme") + textwrap.dedent("""
        import numpy as np
        from fedcache.federate.partitions import PartitionRequest, make_partition
        labels = np.arange(90) % 3
        p = make_partition(PartitionRequest.of("example-round-robin", 4, min_size=1), labels, None, labels, None)
        rows = np.concatenate(p.train)
        print(len(rows), len(set(rows.tolist())), [len(r) for r in p.train])
    """))
    assert out.split()[:2] == ["90", "90"]


def test_the_example_engine_gives_the_in_process_numbers():
    out = run(block("How to add an engine") + RUNS + textwrap.dedent("""
        from fedcache.federate import driver
        from fedcache.federate.driver import Run
        from fedcache.federate.inprocess import run_one
        def method():
            data = synthetic(n_clients=4, per_client=60)
            return METHODS.get("fedproto")(MethodContext(data, "mlp", OptimConfig("adam", 1e-2), Schedule(batch_size=16)))
        schedule = Schedule(rounds=3, fraction=0.5)
        m = method()
        (mine,) = driver.run([Run(m, schedule)], Minimal([m]))
        theirs = run_one(Run(method(), schedule))
        print(mine.history == theirs.history, all(torch.equal(mine.clients[n], theirs.clients[n]) for n in theirs.clients))
    """))
    assert out.split() == ["True", "True"]
