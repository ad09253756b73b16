"""Commands fedcache prints for its user to paste work when pasted: in another folder, from a log read later, with
a space in a path, and with the options the interrupted command was given."""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from fedcache.errors import BadImageError, EntryNotFoundError, IncompleteEntryError, StoreError
from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.runner import ExtractConfig, extract
from fedcache.store.feature_store import FeatureStore
from fedcache.wording import pasted
from tests.extract.test_bad_images import image_folder

BACKBONE = "tiny-timm-random"


def cfg(store, **kw) -> ExtractConfig:
    base = dict(dataset="test-toy", backbones=[BACKBONE], store=store, batch_size=2, chunk_rows=4, workers=0)
    return ExtractConfig(**{**base, **kw})


def _stop_at(label_start: str = "", advance: bool = False):
    """A progress callback that interrupts the extraction as an entry starts (its label begins with
    ``label_start``), or after its first batch is written (``advance``)."""
    def interrupt(event):
        if event.kind == "start" and event.label.startswith(label_start) and not advance:
            raise KeyboardInterrupt
        if event.kind == "advance" and advance:
            raise KeyboardInterrupt
    return interrupt


def _commands(text: str) -> list[list[str]]:
    """The commands in backticks of a message, as the shell splits them when pasted."""
    return [shlex.split(c) for c in text.split("`")[1::2] if c.startswith("fedcache ")]


def _store_of(argv: list[str]) -> str:
    return argv[argv.index("--store") + 1]


def test_pasted_says_a_path_absolute_and_quotes_what_the_shell_would_split(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert pasted("--store", Path("feats.zarr")) == f"--store {tmp_path / 'feats.zarr'}"
    assert pasted(Path("link") / "my feats.zarr") == shlex.quote(str(tmp_path / "link" / "my feats.zarr"))  # link kept
    assert pasted("--domains", "light,dark", "--dataset", "STORE") == "--domains light,dark --dataset STORE"
    assert shlex.split(pasted("--name", "it's mine")) == ["--name", "it's mine"]


@pytest.mark.parametrize("store", ["feats.zarr", "my feats.zarr"])
def test_the_command_that_finishes_an_extraction_finishes_its_store_pasted_in_another_folder(tmp_path, monkeypatch,
                                                                                              capsys, store):
    """The store was said as typed: a relative --store pasted in another folder (or read from a log later) made a
    new, empty store there and left these entries unfinished, and a space in its path broke the command in two."""
    from fedcache.cli import main

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(Path(store)), progress=_stop_at("test-toy/train/dark"))
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(Path(store)).read("test-toy", "train", BACKBONE)
    capsys.readouterr()
    assert main(["store", "ls", "--store", store]) == 0
    listed = " ".join(capsys.readouterr().out.split())  # a long line wraps at its spaces
    finish = _commands(str(unfinished.value))
    assert len(finish) == 1 and finish == _commands(listed.split("finish it with ")[1])
    assert _store_of(finish[0]) == str(work / store)
    monkeypatch.chdir(elsewhere)
    assert main(finish[0][1:]) == 0
    assert not list(elsewhere.iterdir())  # no new store here
    assert len(FeatureStore(work / store).read("test-toy", "train", BACKBONE).domain_names) == 2


def test_every_command_a_message_gives_of_a_relative_store_names_it_absolute(tmp_path, monkeypatch):
    """The store's other messages (another backbone to extract, a damaged entry to remove) said it as typed too."""
    monkeypatch.chdir(tmp_path)
    store = Path("my feats.zarr")
    extract(cfg(store, splits=("train",)))
    fs = FeatureStore(store)
    said = []
    with pytest.raises(EntryNotFoundError) as other_backbone:
        fs.read("test-toy", "train", "tiny-clip-random")
    said.append(str(other_backbone.value))
    with pytest.raises(EntryNotFoundError) as other_split:
        fs.read("test-toy", "test", BACKBONE)
    said.append(str(other_split.value))
    said.append(str(fs.damaged(fs.entries()[0], "a test")))
    commands = [c for text in said for c in _commands(text) if len(c) > 3]  # not "the `fedcache store import` that made it"
    assert len(commands) == 5 and {_store_of(c) for c in commands} == {str(tmp_path / store)}, said


@pytest.fixture
def folder(tmp_path) -> Path:
    """An image folder (a space in its name) with one undecodable image among its training images."""
    return image_folder(tmp_path / "my images")


def test_the_command_that_finishes_an_extraction_that_skipped_bad_images_skips_them(store_path, folder, tmp_path,
                                                                                    monkeypatch, capsys):
    """`extract --skip-bad-images`, interrupted, was to be finished by a command without the flag: pasted, it stopped
    at the first bad image and said to pass --skip-bad-images."""
    from fedcache.cli import main

    options = DatasetOptions(path=folder)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, dataset="imagefolder", dataset_options=options, skip_bad_images=True),
                progress=_stop_at(advance=True))
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("imagefolder", "train", BACKBONE)
    finish = _commands(str(unfinished.value))
    assert len(finish) == 1 and "--skip-bad-images" in finish[0], finish
    assert finish[0][finish[0].index("--path") + 1] == str(folder)
    capsys.readouterr()
    assert main(["store", "ls", "--store", str(store_path)]) == 0
    assert "--skip-bad-images" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(finish[0][1:]) == 0, capsys.readouterr().err
    entry = FeatureStore(store_path).info(FeatureStore(store_path).read("imagefolder", "train", BACKBONE).entry_ids[0])
    assert entry.attrs["n_bad_images"] == 1


def test_a_finished_extraction_that_skipped_bad_images_is_made_again_so_for_another_backbone(store_path, folder):
    """The extraction of another backbone of the same images, which meets the same bad image."""
    extract(cfg(store_path, dataset="imagefolder", dataset_options=DatasetOptions(path=folder), skip_bad_images=True))
    with pytest.raises(EntryNotFoundError) as other:
        FeatureStore(store_path).read("imagefolder", "train", "tiny-clip-random")
    (command,) = _commands(str(other.value))
    assert "--skip-bad-images" in command and command[command.index("--path") + 1] == str(folder)


def test_an_extraction_stopped_at_a_bad_image_and_resumed_skipping_them_is_finished_skipping_them(
        store_path, folder, tmp_path, monkeypatch, capsys):
    """The usual way to --skip-bad-images: a run without it stops at a bad image, and the one its error asks for
    resumes that entry. The flag was recorded only where a run made the entry: interrupted, the resumed run was to be
    finished by a command without it, which stopped at the bad image again, and so was another backbone's extraction."""
    from fedcache.cli import main

    options = DatasetOptions(path=folder)
    with pytest.raises(BadImageError):
        extract(cfg(store_path, dataset="imagefolder", dataset_options=options))
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store_path, dataset="imagefolder", dataset_options=options, skip_bad_images=True),
                progress=_stop_at(advance=True))
    with pytest.raises(IncompleteEntryError) as unfinished:
        FeatureStore(store_path).read("imagefolder", "train", BACKBONE)
    (finish,) = _commands(str(unfinished.value))
    assert "--skip-bad-images" in finish, finish
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(finish[1:]) == 0, capsys.readouterr().err
    with pytest.raises(EntryNotFoundError) as other:
        FeatureStore(store_path).read("imagefolder", "train", "tiny-clip-random")
    (command,) = _commands(str(other.value))
    assert "--skip-bad-images" in command, command


def test_an_entry_that_skipped_bad_images_without_recording_the_flag_is_made_again_skipping_them(store_path, folder):
    """An entry an older fedcache made with --skip-bad-images records no flag, but the bad images it skipped."""
    options = DatasetOptions(path=folder)
    extract(cfg(store_path, dataset="imagefolder", dataset_options=options, skip_bad_images=True, splits=("train",)))
    fs = FeatureStore(store_path)
    (entry,) = fs.entries()
    del fs.root["entries"][entry.entry_id].attrs["skip_bad_images"]
    assert "skip_bad_images" not in FeatureStore(store_path).info(entry.entry_id).attrs
    with pytest.raises(EntryNotFoundError) as other:
        FeatureStore(store_path).read("imagefolder", "train", "tiny-clip-random")
    (command,) = _commands(str(other.value))
    assert "--skip-bad-images" in command, command


def test_the_store_s_other_commands_name_it_absolute(tmp_path, monkeypatch):
    """Removing an entry that says format 2 but is not, repairing one an upgrade skips as damaged, and extracting
    text embeddings the store lacks: commands that named no store, run against the one in the current folder."""
    import json

    from fedcache.store.keys import EntryKey
    from fedcache.store.upgrade import upgrade_store
    from fedcache.store.writer import EntryWriter

    monkeypatch.chdir(tmp_path)
    store = Path("my feats.zarr")
    with pytest.raises(KeyboardInterrupt):
        extract(cfg(store, splits=("train",)), progress=_stop_at(advance=True))
    fs = FeatureStore(store)
    (entry,) = fs.entries()
    meta = store / "entries" / entry.entry_id / "features" / "zarr.json"
    said = json.loads(meta.read_text())
    meta.write_text(json.dumps({**said, "codecs": [*said["codecs"], {"name": "gzip", "configuration": {"level": 1}}]}))
    with pytest.raises(StoreError) as compressed:
        EntryWriter(fs, EntryKey(**entry.key), fs.root["entries"][entry.entry_id])
    old = Path(shutil.copytree(Path(__file__).parent / "store" / "data" / "store-format-1", "old.zarr"))
    (old / "entries" / "41ab763820bc40b8" / "labels" / "c" / "2").unlink()  # a format-1 entry, damaged
    (skipped,) = [u.detail for u in upgrade_store(FeatureStore(old)) if u.detail.startswith("damaged")]
    with pytest.raises(EntryNotFoundError) as no_text:
        fs.read_text("tiny-clip-random", ["a", "b"])
    commands = [c for text in (str(compressed.value), skipped, str(no_text.value)) for c in _commands(text)]
    assert [_store_of(c) for c in commands] == [str(tmp_path / store), str(tmp_path / "old.zarr"), str(tmp_path / store)]


def test_a_placeholder_is_said_as_typed_and_a_str_is_a_value_never_made_absolute(tmp_path, monkeypatch):
    """Placeholders were plain ``str``s, which ``pasted`` says as they are: nothing told one from a path given as a
    ``str`` by mistake, said relative. A placeholder is now marked, and said as typed, even where the shell would
    read it (it is there to be replaced)."""
    from fedcache.wording import Placeholder

    monkeypatch.chdir(tmp_path)
    assert pasted("--store", Placeholder("STORE"), "--ids", Placeholder("ID ...")) == "--store STORE --ids ID ..."
    assert pasted("feats.zarr", "a b", Path("feats.zarr")) == f"feats.zarr 'a b' {tmp_path / 'feats.zarr'}"
