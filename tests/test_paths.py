"""Output paths are checked before work starts, naming the option and the fix."""
import os
from pathlib import Path

import pytest

from fedcache.errors import ConfigError
from fedcache.paths import writable_dir, writable_file


def test_a_directory_to_create_or_reuse_is_fine(tmp_path):
    assert writable_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert writable_dir(tmp_path, "--out") == tmp_path


def test_a_file_where_a_directory_should_be(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"--out .*f is a file; give a directory"):
        writable_dir(tmp_path / "f", "--out")
    with pytest.raises(ConfigError, match=r"--out .*f is a file, so nothing can be made below it"):
        writable_dir(tmp_path / "f" / "run", "--out")


def test_no_permission_is_named(tmp_path, monkeypatch):
    # As root, chmod cannot make a directory unwritable; what os.access answers is what is checked.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=r"--plot .*no permission to write in"):
        writable_dir(tmp_path / "x", "--plot")


def test_a_read_only_file_system_is_named_as_one(tmp_path, monkeypatch):
    """A read-only mount is no permission its owner can change: said as what it is (it read "no permission")."""
    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda path: ReadOnly())
    with pytest.raises(ConfigError, match=rf"--out {tmp_path}/x: {tmp_path} is on a read-only file system; choose a "):
        writable_dir(tmp_path / "x", "--out")


def test_a_file_in_a_folder_this_user_cannot_search_is_said_unreadable(tmp_path, monkeypatch):
    """Another user's store made under umask 077: opening its entries/zarr.json is refused, and os.path.exists says
    False (the folder cannot be searched), so the refusal read "no permission to write" and advised another store."""
    import errno

    from fedcache.paths import denied_problem

    hidden, real_stat = tmp_path / "theirs", os.stat

    def stat(path, *args, **kwargs):
        if str(path).startswith(str(hidden) + os.sep):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    where = str(hidden / "entries" / "zarr.json")
    assert denied_problem(PermissionError(errno.EACCES, "Permission denied", where)) == (
        True, f"no permission to read {where}")
    monkeypatch.setattr(os, "stat", real_stat)  # a file not there: a write was refused
    assert denied_problem(PermissionError(errno.EACCES, "Permission denied", where))[0] is False


def test_files(tmp_path):
    assert writable_file(tmp_path / "a" / "out.h5", "-o") == tmp_path / "a" / "out.h5"
    with pytest.raises(ConfigError, match="is a directory; give a file name"):
        writable_file(tmp_path, "-o")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="nothing can be made below it"):
        writable_file(tmp_path / "f" / "out.h5", "-o")


# ---- every command that writes checks where before it works ------------------------------------
@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    from fedcache.extract.runner import ExtractConfig, extract

    path = tmp_path_factory.mktemp("paths") / "store.zarr"
    extract(ExtractConfig(dataset="test-toy", backbones=["tiny-timm-random"], store=path, workers=0))
    return path


def _commands(store, target):
    """(command line, the option the error must name). A missing store or run directory in each line
    would fail the command with another error if the output were checked only when first written."""
    missing = store.parent / "missing.zarr"
    data = ["-d", "test-toy", "-b", "tiny-timm-random"]
    return {
        "train": (["train", "--store", str(missing), *data, "-m", "fedavg", "-o", str(target)], "--out"),
        "grid": (["grid", "--store", str(missing), *data, "-m", "fedavg", "-o", str(target)], "--out"),
        "partition": (["partition", "--store", str(missing), *data, "--plot", str(target / "p")], "--plot"),
        "shard": (["shard", "--store", str(store), *data, "--out", str(target)], "--out"),
        "flower-app": (["flower-app", str(target)], "Flower App directory"),
        "report": (["report", str(store.parent / "no-runs"), "-o", str(target)], "--out"),
        "reproduce": (["reproduce", "fedpcl-table2", "--store", str(missing), "-o", str(target)], "--out"),
        "backbone-heatmap": (["backbone-heatmap", "--store", str(missing), "-d", "test-toy", "-b", "a,b", "-o", str(target / "h.png")], "--out"),
    }


def _expect_one_clear_error(capsys, argv, option, says):
    from fedcache.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, (argv, err)
    assert err.startswith("error:") and option in err and says in err, (argv, err)


def deny_writes_below(monkeypatch, folder) -> None:
    """os.access as a user without write permission in ``folder`` sees it (for tests run as root)."""
    real, folder = os.access, str(folder)

    def access(path, mode, *args, **kwargs):
        inside = os.path.abspath(path) == folder or os.path.abspath(path).startswith(folder + os.sep)
        return False if inside and mode & os.W_OK else real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


COMMANDS = ("train", "grid", "partition", "shard", "flower-app", "report", "reproduce", "backbone-heatmap")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_below_a_file_is_one_clear_error_before_any_work(command, toy_store, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    argv, option = _commands(toy_store, tmp_path / "f" / "below")[command]
    _expect_one_clear_error(capsys, argv, option, "is a file, so nothing can be made below it")


@pytest.mark.parametrize("command", ["train", "grid", "shard", "flower-app", "report", "reproduce"])  # directories
def test_a_file_given_as_an_output_directory(command, toy_store, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    argv, option = _commands(toy_store, tmp_path / "f")[command]
    _expect_one_clear_error(capsys, argv, option, "is a file; give a directory")


@pytest.mark.parametrize("command", ["train", "grid", "shard", "flower-app", "report", "reproduce"])  # directories
def test_a_link_to_nothing_given_as_an_output_directory(command, toy_store, tmp_path, capsys):
    """mkdir refused it as "File exists", said as the OS said it, with no word of the link."""
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    argv, option = _commands(toy_store, tmp_path / "gone")[command]
    _expect_one_clear_error(capsys, argv, option, f"is a symbolic link to {tmp_path / 'nowhere'}, which does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_a_link_to_nothing_above_an_output_directory_is_named(tmp_path):
    (tmp_path / "gone").symlink_to("nowhere")
    with pytest.raises(ConfigError, match=f"--out {tmp_path}/gone/runs/a: {tmp_path}/gone in it is a symbolic link to "
                                          "nowhere, which does not exist"):
        writable_dir(tmp_path / "gone" / "runs" / "a", "--out")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_directory(command, toy_store, tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):  # root writes anywhere: the check is what os.access answers, so it answers as for a user
            deny_writes_below(monkeypatch, ro)
        argv, option = _commands(toy_store, ro / "out")[command]
        _expect_one_clear_error(capsys, argv, option, "no permission to write in")
    finally:
        ro.chmod(0o755)


# ---- a file system that refuses what the permission checks let through ------------------------------------
def refuse_new_files_in(monkeypatch, folder) -> None:
    """Every new file or folder below ``folder`` refused as /proc refuses it to root, whose permission checks all
    pass: "No such file or directory", the folder being there."""
    import errno

    folder = os.path.abspath(folder)
    real_open, real_mkdir = os.open, os.mkdir

    def below(path) -> bool:
        return os.path.abspath(path).startswith(folder + os.sep)

    def refused(path):
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and below(path) and not os.path.exists(path):
            raise refused(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if below(path):
            raise refused(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)


def _writers(store, target):
    """(command line, the option the error names, what it made first, its exit code): every output of
    ``_commands`` and the demo's, an extraction's new store and an export's file. A missing store (a file for the
    demo, which would otherwise extract one) fails each line with another error if the output is not looked at
    first; the export reads ``store``, then made its lock file."""
    lines = {name: (argv, option, target, 2) for name, (argv, option) in _commands(store, target).items()}
    data = ["-d", "test-toy", "-b", "tiny-timm-random"]
    export = target.parent / "x.npz"
    return {**lines,
            "demo": (["demo", "--store", str(store / "zarr.json"), "-b", "tiny-timm-random", "-o", str(target)],
                     "--out", target, 2),
            "extract": (["extract", *data, "--store", str(target), "--workers", "0"], "feature store", target, 1),
            "export": (["store", "export", "--store", str(store), *data, "-o", str(export)], f"write {export}",
                       export, 2)}


REFUSING = [pytest.param(None, id="faked"), pytest.param("/proc", id="real-proc", marks=pytest.mark.skipif(
    not os.access("/proc", os.W_OK) or not os.path.exists("/proc/self"),
    reason="/proc passes the permission checks only for root (else they refuse it first), and only Linux has one"))]


@pytest.mark.parametrize("where", REFUSING)
@pytest.mark.parametrize("command", [*COMMANDS, "demo", "extract", "export"])
def test_an_output_the_file_system_refuses_is_one_line_before_any_work(command, where, toy_store, tmp_path, capsys,
                                                                      monkeypatch):
    """`train -o /proc/x` as root said "error: No such file or directory: /proc/x" (the store read, the partition
    made), `demo -o /proc/x` so after minutes of extraction, `shard`, `grid`, `flower-app`, `partition --plot`
    and `store export` alike: one line naming the option, the path and what the file system refused, nothing made."""
    from fedcache.cli import main

    folder = tmp_path / "refusing"
    folder.mkdir()
    if where is None:
        refuse_new_files_in(monkeypatch, folder)
    else:
        folder = Path(where)
    argv, option, made, expected = _writers(toy_store, folder / "fedcache-out")[command]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == expected and len(lines) == 1 and "Traceback" not in err, (argv, err)
    assert option in lines[0] and f"the file system refused to create {made} (No such file or directory)" in lines[0]
    assert not made.exists() and (where is not None or list(folder.iterdir()) == [])


def test_a_directory_there_whose_file_system_refuses_files_is_named(tmp_path, monkeypatch):
    """`train -o /proc` (there, and writable to root) waited for its lock file for ever; `--plot /proc/p` and a
    file's folder there are named by the file."""
    refuse_new_files_in(monkeypatch, tmp_path / "run")
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError) as refused:
        writable_dir(tmp_path / "run", "--out")
    assert str(refused.value) == (f"--out {tmp_path}/run: the file system refused to create a file in {tmp_path}/run "
                                  "(No such file or directory); choose a directory you can write to")
    with pytest.raises(ConfigError, match=rf"--plot {tmp_path}/run/p.png: the file system refused to create "
                                          rf"{tmp_path}/run/p.png \(No such"):
        writable_file(tmp_path / "run" / "p.png", "--plot")
    assert list((tmp_path / "run").iterdir()) == []
    writable_dir(tmp_path / "elsewhere", "--out")  # the file it made to ask is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
