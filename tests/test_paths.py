"""Output paths are checked before work starts, naming the option and the fix."""
import os

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


def test_files(tmp_path):
    assert writable_file(tmp_path / "a" / "out.h5", "-o") == tmp_path / "a" / "out.h5"
    with pytest.raises(ConfigError, match="is a directory; give a file name"):
        writable_file(tmp_path, "-o")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="nothing can be made below it"):
        writable_file(tmp_path / "f" / "out.h5", "-o")
