"""`store import` checks every field before writing: a bad file is one clear error naming the field, nothing is
written, nothing is truncated or coerced; a bounded fuzz of malformed files raises nothing but FedcacheError."""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedcache.cli import main
from fedcache.errors import ConfigError, FedcacheError
from fedcache.store.feature_store import FeatureStore
from fedcache.store.interchange import import_file
from tests.test_paths import deny_writes_below

N = 12


def good() -> dict:
    rng = np.random.default_rng(0)
    return {"features": rng.normal(size=(N, 4)).astype(np.float32), "labels": np.arange(N) % 3,
            "domains": np.arange(N) % 2}


def in_split(arrays: dict, split: str = "train") -> dict:
    # Named splits: in a flat .npz the key "domains" would be both the indices and their names.
    return {f"{split}/{k}": v for k, v in arrays.items()}


def save_npz(path: Path, arrays: dict, **meta) -> Path:
    np.savez(path, **{k.replace("/", "__"): v for k, v in arrays.items()}, **{k: np.array(v) for k, v in meta.items()})
    return path


def save_h5(path: Path, arrays: dict, **meta) -> Path:
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v
        f.attrs.update(meta)
    return path


BAD_FIELDS = {
    "domains shorter than features": ({"domains": np.zeros(2, int)}, "domains has 2 values for 12"),
    "negative domain index": ({"domains": np.arange(N) % 2 - 1}, "domains must be non-negative"),
    "float labels truncated": ({"labels": np.full(N, 0.7)}, "labels must be whole numbers, got 0.7"),
    "nan labels": ({"labels": np.full(N, np.nan)}, "labels must be whole numbers"),
    "complex features": ({"features": np.ones((N, 4), complex)}, "features must be real numbers"),
    "string labels": ({"labels": np.array(["a"] * N)}, "labels must be integers"),
    "bool features": ({"features": np.ones((N, 4), bool)}, "features must be real numbers"),
    "1e300 overflows float32": ({"features": np.full((N, 4), 1e300)}, "beyond the float32 range"),
    "nan features": ({"features": np.full((N, 4), np.nan)}, "NaN or infinite"),
    "(N, 1) labels": ({"labels": (np.arange(N) % 3)[:, None]}, r"labels must be a 1-D array.*ravel"),
    "width 0": ({"features": np.zeros((N, 0), np.float32)}, r"features must be \(N, D\)"),
    "empty arrays": ({"features": np.zeros((0, 4)), "labels": np.zeros(0, int), "domains": np.zeros(0, int)},
                     r"features must be \(N, D\) with N >= 1"),
    "1-D features": ({"features": np.zeros(N)}, r"features must be \(N, D\)"),
    "huge uint labels": ({"labels": np.full(N, 2**63 + 5, np.uint64)}, "non-negative \\(and within int64\\)"),
    "repeated ids": ({"ids": np.zeros(N, int)}, "ids repeat within a domain"),
    "unknown array": ({"weights": np.zeros(N)}, "unknown array 'weights'"),
}


@pytest.mark.parametrize("fmt", ["npz", "h5"])
@pytest.mark.parametrize("case", BAD_FIELDS, ids=lambda c: c.replace(" ", "-"))
def test_bad_field_is_refused_and_nothing_written(case, fmt, tmp_path, store_path):
    change, message = BAD_FIELDS[case]
    arrays = {k: v for k, v in {**good(), **change}.items()}
    if fmt == "h5" and arrays["labels"].dtype.kind == "U":
        arrays["labels"] = arrays["labels"].astype("S")
    path = (save_npz if fmt == "npz" else save_h5)(tmp_path / f"f.{fmt}", arrays)
    store = FeatureStore(store_path)
    with pytest.raises(ConfigError, match=message):
        import_file(store, path, "mine", "enc", split="train")
    assert store.entries() == []


BAD_META = {
    "classes not JSON": ({"classes": "[a, b"}, "'classes' is not valid JSON"),
    "classes not a list": ({"classes": '{"a": 1}'}, "'classes' must be a JSON list"),
    "classes too short for labels": ({"classes": '["a", "b"]'}, "labels: 2 at row 2, but 'classes' lists only 2"),
    "repeated classes": ({"classes": '["a", "a", "b"]'}, "repeats a name"),
    "domain names too short": ({"domains": '["only"]'}, "domains: 1 at row 1, but 'domains' names only 1"),
    "random_weights not a bool": ({"random_weights": '"yes"'}, "'random_weights' must be JSON true or false"),
    "random_weights not JSON": ({"random_weights": "maybe"}, "'random_weights' is not valid JSON"),
}


@pytest.mark.parametrize("fmt", ["npz", "h5"])
@pytest.mark.parametrize("case", BAD_META, ids=lambda c: c.replace(" ", "-"))
def test_bad_attribute_is_refused(case, fmt, tmp_path, store_path):
    meta, message = BAD_META[case]
    path = (save_npz if fmt == "npz" else save_h5)(tmp_path / f"f.{fmt}", in_split(good()), **meta)
    with pytest.raises(ConfigError, match=message):
        import_file(FeatureStore(store_path), path, "mine", "enc")


def test_splits_of_other_widths_and_split_option_misuse(tmp_path, store_path):
    a, b = good(), good()
    arrays = in_split(a) | in_split({**b, "features": b["features"][:, :3]}, "test")
    path = save_h5(tmp_path / "w.h5", arrays)
    with pytest.raises(ConfigError, match=r"different widths \[3, 4\]"):
        import_file(FeatureStore(store_path), path, "mine", "enc")
    path = save_h5(tmp_path / "s.h5", in_split(a))
    with pytest.raises(ConfigError, match="--split is only for a file with flat arrays"):
        import_file(FeatureStore(store_path), path, "mine", "enc", split="test")
    path = save_h5(tmp_path / "m.h5", {**a, **in_split(a)})
    with pytest.raises(ConfigError, match="mixes flat arrays with splits"):
        import_file(FeatureStore(store_path), path, "mine", "enc", split="test")


def test_exact_values_survive_and_every_named_domain_gets_an_entry(tmp_path, store_path):
    arrays = {**good(), "labels": (np.arange(N) % 3).astype(np.float64)}  # whole floats are integers
    path = save_npz(tmp_path / "ok.npz", in_split(arrays), classes=json.dumps(["a", "b", "c"]), domains=json.dumps(["x", "y", "z"]))
    ids = import_file(FeatureStore(store_path), path, "mine", "enc").ids
    assert len(ids) == 3  # domain "z" has no rows: an empty entry, as readers expect every domain
    t = FeatureStore(store_path).read("mine", "train", "enc")
    order = np.lexsort((t.ids, t.domains))
    np.testing.assert_array_equal(t.features[order], arrays["features"][np.lexsort((np.arange(N), arrays["domains"]))])
    assert t.domain_names == ("x", "y", "z") and t.class_names == ("a", "b", "c") and len(t) == N


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04broken"], ids=["zero-bytes", "not-zip", "torn-zip"])
def test_unreadable_npz_is_one_line_not_interrupted(content, tmp_path, store_path, capsys):
    path = tmp_path / "x.npz"
    path.write_bytes(content)
    code = main(["store", "import", str(path), "-d", "m", "-b", "e", "--split", "train", "--store", str(store_path)])
    err = capsys.readouterr().err
    assert code == 2 and str(path) in err and "interrupted" not in err and "Traceback" not in err
    assert not store_path.exists()


def test_non_hdf5_h5_and_object_arrays(tmp_path, store_path):
    (tmp_path / "x.h5").write_bytes(b"plain text, not HDF5")
    with pytest.raises(ConfigError, match="not an HDF5 file"):
        import_file(FeatureStore(store_path), tmp_path / "x.h5", "m", "e", split="train")
    np.savez(tmp_path / "o.npz", features=np.zeros((2, 2)), labels=np.array([object(), 1], dtype=object))
    with pytest.raises(ConfigError, match="'labels' cannot be read without unpickling"):
        import_file(FeatureStore(store_path), tmp_path / "o.npz", "m", "e", split="train")


def test_export_into_a_missing_or_read_only_directory(tmp_path, store_path, capsys, monkeypatch):
    path = save_npz(tmp_path / "ok.npz", good())
    import_file(FeatureStore(store_path), path, "mine", "enc", split="train")
    args = ["store", "export", "-d", "mine", "-b", "enc", "--splits", "train", "--store", str(store_path), "-o"]
    assert main([*args, str(tmp_path / "nope" / "out.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "x.h5"), "--format", "npz"]) == 0
    assert (tmp_path / "x.h5").is_file() and not (tmp_path / "x.h5.npz").exists()  # written where asked
    capsys.readouterr()
    assert main([*args, str(tmp_path / "x.h5" / "out.npz")]) == 2  # a path below a file
    assert "x.h5 is a file, not a directory" in capsys.readouterr().err
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.access(ro, os.W_OK):  # root writes anywhere: answer as os.access would for a user
        deny_writes_below(monkeypatch, ro)
    assert main([*args, str(ro / "out.npz")]) == 2
    assert "not writable" in capsys.readouterr().err


def _import_split(tmp_path, store_path, split: str, arrays: dict, **meta) -> None:
    path = save_npz(tmp_path / f"{split}.npz", arrays, **meta)
    import_file(FeatureStore(store_path), path, "mine", "enc", split=split)


@pytest.mark.parametrize("test_split, says", [
    ({"features": np.ones((N, 3), np.float32)}, "training features are 4 wide but the test features 3"),
    ({"labels": np.arange(N) % 7}, "name different classes"),
    ({"domains": np.zeros(N, int)}, "name different domains"),
], ids=["width", "classes", "domains"])
def test_splits_imported_one_by_one_must_agree_before_training(test_split, says, tmp_path, store_path, capsys):
    """Each split alone is a valid file, so import takes it; training on both is refused with one error
    (it was a traceback for another width, and silently scored 3 classes against test labels of 7)."""
    _import_split(tmp_path, store_path, "train", good())
    _import_split(tmp_path, store_path, "test", {**good(), **test_split})
    code = main(["train", "--store", str(store_path), "-d", "mine", "-b", "enc", "-m", "fedavg", "--clients", "2",
                 "--rounds", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "error: " in err and says in err and "Traceback" not in err, err


# ---- a bounded fuzz: any malformed file is a FedcacheError or a correct import --------------------------
ARRAYS = st.one_of(
    st.builds(lambda n, d, kind: np.zeros((n, d), kind), st.integers(0, 3), st.integers(0, 3),
              st.sampled_from(["f4", "f8", "i8", "u1", "c8", "?", "U2", "f2"])),
    st.builds(lambda n, kind, v: np.full(n, v).astype(kind), st.integers(0, 4), st.sampled_from(["f8", "i8", "u8", "i1", "U1"]),
              st.sampled_from([0, 1, 2, -1, 0.5, 1e300, 255])),
    st.builds(lambda v: np.array(v), st.sampled_from([0, 1.5, "x", '["a"]', "[]", "true", "{"])),
)
NAMES = st.sampled_from(["features", "labels", "domains", "ids", "classes", "random_weights", "train__features",
                         "train__labels", "test__features", "test__labels", "x"])


@settings(max_examples=60, deadline=2000, suppress_health_check=list(HealthCheck), derandomize=True)
@given(arrays=st.dictionaries(NAMES, ARRAYS, max_size=5), fmt=st.sampled_from(["npz", "h5"]), split=st.sampled_from([None, "train"]))
def test_fuzz_malformed_files_raise_only_fedcache_errors(arrays, fmt, split, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / f"f.{fmt}"
    if fmt == "npz":
        np.savez(path, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                if v.dtype.kind == "U":
                    v = v.astype("S")
                if v.ndim == 0 and k in ("classes", "random_weights"):
                    f.attrs[k] = v
                else:
                    f[k.replace("__", "/")] = v
    try:
        ids = import_file(FeatureStore(tmp / "s.zarr"), path, "m", "e", split=split).ids
    except FedcacheError:
        return
    store = FeatureStore(tmp / "s.zarr")
    for e in store.entries():
        assert store.verify(e)[0] == "ok" and len(ids) >= 1


@pytest.mark.parametrize("dataset, backbone, option", [("", "enc", "--dataset"), ("  ", "enc", "--dataset"),
                                                        ("m", "", "--backbone"), ("m", "a,b", "--backbone")])
def test_a_name_train_could_not_select_is_refused(dataset, backbone, option, tmp_path, store_path):
    # `train -b a,b` means two backbones and `-d ''` no dataset: such an import was accepted and never readable.
    path = save_npz(tmp_path / "ok.npz", good())
    with pytest.raises(ConfigError, match=f"^{option} .*(cannot be empty|cannot hold a comma)"):
        import_file(store_path, path, dataset, backbone, split="train")
    assert not store_path.exists()


def test_a_folder_given_to_import_is_said_to_be_one(tmp_path, store_path, capsys):
    """`store import runs` (a folder) said `no such file: runs` of a folder that is there."""
    (tmp_path / "runs").mkdir()
    code = main(["store", "import", str(tmp_path / "runs"), "-d", "m", "-b", "e", "--store", str(store_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'runs'} is a folder; give an .h5/.hdf5 or .npz file" in err


def test_a_misspelt_export_format_is_refused_before_the_store_is_read(tmp_path, store_path, capsys, monkeypatch):
    """`--format hd5` named no format meant, and only once the store's tables had been read (minutes, for a large
    dataset)."""
    path = save_npz(tmp_path / "ok.npz", good())
    import_file(FeatureStore(store_path), path, "mine", "enc", split="train")

    def unread(*args, **kwargs):
        raise AssertionError("the store was read")

    monkeypatch.setattr(FeatureStore, "read_splits", unread)
    code = main(["store", "export", "-d", "mine", "-b", "enc", "--splits", "train", "--store", str(store_path),
                 "-o", str(tmp_path / "out.h5"), "--format", "hd5"])
    assert code == 2 and "got 'hd5' (did you mean 'h5'?)" in capsys.readouterr().err


def test_two_exports_to_one_file_at_once(tmp_path, store_path, monkeypatch):
    """Two exports to one --out wrote one partial file together: the first renamed it into place and said it wrote its
    splits (whatever the file then held), the second failed with "No such file or directory". The second is refused
    at once, naming the first, and the file is the first's, whole."""
    from fedcache.errors import EntryLockedError
    from fedcache.store import exporting

    path = save_npz(tmp_path / "ok.npz", good())
    import_file(FeatureStore(store_path), path, "mine", "enc", split="train")
    tables = FeatureStore(store_path).read_splits("mine", ["train"], "enc")
    out, refused, npz = tmp_path / "out.npz", [], exporting._FORMATS["npz"]

    def meanwhile(target, arrays, meta):
        with pytest.raises(EntryLockedError) as second:
            exporting.export_tables(tables, out, "npz", overwrite=True)
        refused.append(str(second.value))
        npz.write(target, arrays, meta)

    monkeypatch.setitem(exporting._FORMATS, "npz", exporting._Format(meanwhile, npz.level))
    exporting.export_tables(tables, out, "npz")
    assert refused and f"{out} is being written by another process" in refused[0]
    with np.load(out) as whole:
        assert whole["train__features"].shape == good()["features"].shape
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.npz", "out.npz", "store.zarr"]
