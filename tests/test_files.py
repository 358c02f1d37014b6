"""atomic_write: all or nothing, with the permissions a plain open() would give."""

import os
import stat

import pytest

from microgpt.files import atomic_write, write_text


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_write(path, "w") as f:
            f.write("half")
            raise RuntimeError("killed")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_new_files_get_the_umask_mode_and_old_files_keep_theirs(tmp_path):
    umask = os.umask(0o022)
    try:
        new = write_text(tmp_path / "new.txt", "x")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644  # not mkstemp's 0600
        old = tmp_path / "old.txt"
        old.write_text("x")
        old.chmod(0o640)
        write_text(old, "y")
        assert stat.S_IMODE(old.stat().st_mode) == 0o640 and old.read_text() == "y"
    finally:
        os.umask(umask)
