"""A grid's shared features (fedcache/grids/features.py): memory-mapped by the workers without a copy, and refused
when the store's entries changed since the grid started."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fedcache.errors import ConfigError
from tests.conftest import BACKBONE


def test_a_grid_refuses_features_that_changed_since_it_started(toy_grid, toy_store, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(toy_grid, out)
    spec = json.loads((out / "grid.json").read_text())
    spec["out"] = str(out)
    (out / "grid.json").write_text(json.dumps(spec))
    meta = json.loads((out / "features" / "meta.json").read_text())
    meta["train"]["entry_ids"][0] = "0" * 16  # as if that entry had been re-extracted since
    (out / "features" / "meta.json").write_text(json.dumps(meta))
    from fedcache.api import grid

    with pytest.raises(ConfigError, match="changed since the grid"):
        grid(store=toy_store, dataset="test-toy", backbones=BACKBONE, methods="fedavg,fedproto",
             sweep={"partition": "dirichlet", "clients": 3, "alpha": [0.5, 5], "rounds": 3}, seeds=[0, 1], out=out)


def test_workers_train_on_the_memory_mapped_features_without_copying_them(toy_grid):
    import numpy as np

    from fedcache.federate.data import FederatedData
    from fedcache.grids.features import read_features
    from fedcache.store import mapping

    train_t, test_t = read_features(toy_grid / "features")
    assert mapping.is_mapped(train_t.features) and train_t.features.dtype == np.float32
    data = FederatedData.from_tables(train_t, test_t, [np.arange(len(train_t))], [np.arange(len(test_t))])
    assert np.shares_memory(data.x_train.numpy(), train_t.features)  # the tensor is a view of the mapped file
    assert np.shares_memory(data.x_test.numpy(), test_t.features)


@pytest.mark.parametrize("damage, said", [
    ("train_labels.npy", r"train_labels.npy is damaged \(cut short or not a .npy file"),
    ("train_features.npy", r"train_features.npy is damaged \(cut short or not a .npy file"),
    ("gone:test_ids.npy", r"test_ids.npy is damaged \(missing;"),
    ("other:test_ids.npy", r"features is damaged \(its test arrays differ in rows \(.*test_ids.npy 1,"),
])
def test_a_damaged_features_file_is_one_line_that_names_the_way_on(toy_grid, tmp_path, damage, said):
    """A .npy cut short (a crash as the grid wrote it) was numpy's ValueError traceback on every run of the grid."""
    from fedcache.errors import DamagedFileError
    from fedcache.grids.features import read_features

    folder = tmp_path / "features"
    shutil.copytree(toy_grid / "features", folder)
    name = damage.partition(":")[2] or damage
    if damage.startswith("gone:"):
        (folder / name).unlink()
    elif damage.startswith("other:"):  # a whole .npy, of another table
        np.save(folder / name, np.zeros(1, np.int64))
    else:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:len(data) - 40])
    with pytest.raises(DamagedFileError, match=said) as refused:
        read_features(folder)
    assert str(refused.value).endswith(f"delete the folder {folder} and run the grid again, which writes the features again")
