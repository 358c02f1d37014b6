"""atomic_write: all or nothing, with the permissions a plain open() would give; check_new_file:
where a user-named output may go."""

import os
import re
import stat

import pytest

from microgpt.files import OutputRefused, atomic_write, check_new_file, write_text


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


def test_a_new_file_never_replaces_a_file_that_appeared_meanwhile(tmp_path):
    path = tmp_path / "out.txt"
    write_text(path, "new\n", replace=False)
    assert path.read_text() == "new\n"
    with pytest.raises(FileExistsError):
        write_text(path, "other\n", replace=False)
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left
    write_text(path, "replaced\n")
    assert path.read_text() == "replaced\n"


def _run_folder(root):
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text("x: 1\n")
    (root / "checkpoints").mkdir()
    (root / "config.yaml").write_text("x: 1\n")
    return root


@pytest.mark.parametrize(
    "where, message",
    [
        ("run/samples.txt", "inside the run folder"),
        ("run/.hydra/config.yaml", "inside the run folder"),
        ("run/checkpoints/new.txt", "inside the run folder"),
        ("run/deeper/new.txt", "inside the run folder"),
        ("conf/config.yaml", "inside the config folder"),
        ("conf/model/new.yaml", "inside the config folder"),
        ("fifo", "not a regular file"),
        ("existing.txt", "already exists; add overwrite=true"),
        ("/dev/stdout", "device or system path; for standard output give out=-"),
        ("/proc/self/fd/2", "device or system path"),
        ("data.txt", "is the data; out= never replaces it"),
    ],
)
def test_out_refuses_what_it_must_never_replace(tmp_path, where, message):
    _run_folder(tmp_path / "run")
    (tmp_path / "run" / "deeper").mkdir()
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text("defaults: []\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "existing.txt").write_text("kept\n")
    (tmp_path / "data.txt").write_text("anna\n")
    path = where if where.startswith("/") else tmp_path / where
    for overwrite in (False, True):
        if overwrite and "already exists" in message:
            continue
        with pytest.raises(OutputRefused, match=re.escape(message)):
            check_new_file(path, "out", overwrite, {tmp_path / "data.txt": "the data"})
    assert (tmp_path / "existing.txt").read_text() == "kept\n"


def test_out_writes_a_new_file_or_with_overwrite_an_existing_one(tmp_path):
    assert check_new_file(tmp_path / "new.txt") == tmp_path / "new.txt"
    (tmp_path / "old.txt").write_text("x")
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "old.txt")
    assert check_new_file(link, overwrite=True) == tmp_path / "old.txt"  # a link: its target
