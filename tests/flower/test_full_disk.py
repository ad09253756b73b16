"""Flower's files on a full disk (tests/faults.py): the App's project file, the loopback certificates and keys, and
the request and answer between a simulation and its caller are written whole or not at all, each failure one line
naming the file; what was there before is kept, and no temporary file is left."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fedcache.errors import DiskFullError
from fedcache.flower import sim
from fedcache.flower.local import node_keys, self_signed
from fedcache.flower.project import write_app
from tests.faults import leftovers
from tests.flower.conftest import toy_config


def test_a_flower_app_that_does_not_fit_keeps_the_last_project_file(tight_disk):
    project = write_app(tight_disk.path / "app")
    before = project.read_text()
    tight_disk.leave(100)  # less than a project file: a torn one read as whole by `flwr run`
    with pytest.raises(DiskFullError, match=f"the Flower App's project file {project}"):
        write_app(tight_disk.path / "app")
    assert project.read_text() == before and leftovers(tight_disk.path) == []


def test_certificates_and_keys_that_do_not_fit_are_not_left_torn(tight_disk):
    certs = tight_disk.path / "certs"
    tight_disk.leave(700)  # a certificate (the CA's, faked) fits, not the others
    with pytest.raises(DiskFullError, match="certificate"):
        self_signed(certs)
    assert all(p.read_bytes().endswith(b"-----END CERTIFICATE-----\n") for p in certs.iterdir())  # what is there is whole
    tight_disk.leave(0)
    with pytest.raises(DiskFullError, match="the private key"):
        node_keys(tight_disk.path / "keys", "node0")
    assert list((tight_disk.path / "keys").iterdir()) == []


def test_a_private_key_is_private_from_its_first_byte_even_over_a_killed_writes_leftover(tmp_path):
    """A write killed before its rename leaves ``server.key.tmp``; one made readable by others (or opened by
    another user) is not written into: the key is a new file, 0600 from the start."""
    (tmp_path / "certs").mkdir()
    stale = tmp_path / "certs" / "server.key.tmp"
    stale.write_bytes(b"")
    stale.chmod(0o644)
    with open(stale, "rb") as other:  # another user's descriptor on the leftover
        certs = self_signed(tmp_path / "certs")
        assert other.read() == b""
    assert stat.S_IMODE(certs.key.stat().st_mode) == 0o600 and b"PRIVATE KEY" in certs.key.read_bytes()
    assert leftovers(tmp_path) == []


def test_a_simulations_answer_that_does_not_fit_is_no_torn_answer(tight_disk, monkeypatch, caplog):
    """The answer was written in place: cut short by a full disk, its caller read it and stopped on a traceback."""
    request, answer = tight_disk.path / "request.json", tight_disk.path / "answer.json"
    spec = toy_config(tight_disk.path / "store.zarr").to_dict()
    request.write_text(json.dumps({"spec": spec, "cpus": 1, "threads": 0, "engine": {"out": None}, "caller": os.getpid(),
                                   "progress": str(tight_disk.path / "progress.jsonl"), "started": 0.0}))
    monkeypatch.setattr(sim, "on_orphaned", lambda *a, **k: None)
    monkeypatch.setattr(sim, "train_flower_sim_here", lambda spec, cpus, **how: {"mean_accuracy": 50.0, "per_client": [1.0] * 500})
    monkeypatch.setattr(sim.signal, "signal", lambda *a: None)
    tight_disk.leave(100)
    assert sim._child(request, answer) == 1
    assert not answer.exists() and leftovers(tight_disk.path) == []
    assert f"the Flower simulation's answer {answer}" in caplog.text


def test_a_simulations_request_that_does_not_fit_is_one_line_naming_it(tight_disk, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tight_disk.path))
    import types

    never = types.SimpleNamespace(Popen=lambda *a, **k: pytest.fail("started without its request"))
    monkeypatch.setattr(sim, "subprocess", never)  # the module's alone: the tmpfs is unmounted with the real one
    tight_disk.leave(100)
    with pytest.raises(DiskFullError, match="the Flower simulation's request .*request.json"):
        sim.train_flower_sim(toy_config(Path(tight_disk.path / "store.zarr")))
    assert leftovers(tight_disk.path) == []
