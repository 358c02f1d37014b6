"""What a run shows of its samples: names marked "new" or found in a split (makemore style), or
passages continuing a prompt, each with its longest stretch found verbatim in the training text
(the number to watch for memorisation). The trainer logs `sample_for_run`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from microgpt.data.dataset import Data
from microgpt.sample.generate import decode, decoding_threads, sample_items, seeded

PASSAGE_LENGTH = 300  # new characters of a text sample, when max_len is not given
EVAL_NAMES, EVAL_PASSAGES = 10, 1  # items each evaluation logs


@dataclass
class Samples:
    """Sampled items and the lines that show them (printed and written)."""

    items: list[str]  # names, or passages (prompt + continuation)
    lines: list[str]
    written: list[str]  # what out= writes: the names (not the empty ones), or the passages' lines
    marked: list[tuple[str, str]] | None = None  # names: (name, "new" | "train" | ...)
    note: str = ""  # passages: what was done to the prompt, if anything


def sample_names(model, data: Data, n: int, seed: int | None, prefix="", **settings) -> Samples:
    """`n` names after `prefix` (data.prompt; sample_items' settings), each marked with the split
    that holds it, or new."""
    data.prompt(prefix)  # the format's rules for a user's input
    names = sample_items(model, data.tokenizer, n, prefix, seed=seed, **settings)
    marked = mark_items(names, data.split)
    # out= lists the names: an empty one (the model ended at once) is counted, not written
    return Samples(names, format_marked(marked), [n for n in names if n], marked=marked)


def mark_items(items: list[str], split) -> list[tuple[str, str]]:
    """Each item with where it was found: "train", "val", "test", "new", or "empty" (an item that
    ended at once). split: a data.Split, or None (every non-empty item is then "new")."""
    found = split.where if split is not None else lambda item: None
    return [(item, "empty" if item == "" else found(item) or "new") for item in items]


def format_marked(marked: list[tuple[str, str]]) -> list[str]:
    """Printable lines, makemore style: each item with its mark, then a summary line."""
    width = max((len(item) for item, _ in marked), default=0)
    lines = [
        f"{item:<{width}}  {f'({where})' if where in ('new', 'empty') else f'(in {where})'}"
        for item, where in marked
    ]
    count = Counter(where for _, where in marked)
    unique = len({item for item, where in marked if where != "empty"})
    empty = f", {count['empty']} empty" if count["empty"] else ""
    lines.append(f"{count['new']} of {len(marked)} new, {unique} unique{empty}")
    return lines


def sample_passages(model, data: Data, n: int, seed, prefix="", max_len=None, **sampling):
    """`n` continuations of `prefix` (data.prompt) by `max_len` characters (decode's `sampling`
    settings), each with its longest verbatim stretch of the training text, where there is one."""
    prompt, note = data.prompt(prefix)
    device, tokenizer = next(model.parameters()).device, data.tokenizer
    new = PASSAGE_LENGTH if max_len is None else max_len
    with decoding_threads(model, n):
        rows = decode(model, prompt, n, new, False, generator=seeded(device, seed), **sampling)
    new_ids, start = rows[:, len(prompt) :].tolist(), tokenizer.decode(prompt)
    passages = [start + "".join(tokenizer.itos.get(i, "?") for i in row) for row in new_ids]
    index = data.verbatim_index
    verbatim = [index.longest(row)[0] for row in new_ids] if index is not None else None
    lines = format_passages(passages, verbatim)
    return Samples(passages, lines, lines[:-1], note=note)


def format_passages(passages: list[str], verbatim: list[int] | None) -> list[str]:
    """A header line per passage (with its longest verbatim stretch), its lines, and a summary."""
    lines = []
    for i, passage in enumerate(passages):
        lines.append(f"--- passage {i + 1}")
        if verbatim is not None:
            lines[-1] += f": longest stretch found in the training text {verbatim[i]} characters"
        lines.extend(passage.split("\n"))
    if verbatim:
        lines.append(
            f"{len(passages)} passage(s); longest verbatim stretch from the training text: "
            f"median {statistics.median(verbatim):g}, max {max(verbatim)} characters"
        )
    else:
        lines.append(f"{len(passages)} passage(s) (no training text to compare with)")
    return lines


def sample_for_run(model, data: Data, n: int | None, seed: int, **settings) -> Samples:
    """What a run shows: `n` names marked with their split (items with a boundary token) or
    passages with their longest verbatim stretch (a stream); n=None: what an evaluation logs."""
    if data.boundary:
        return sample_names(model, data, EVAL_NAMES if n is None else n, seed, **settings)
    settings.pop("batch_size", None), settings.pop("progress", None)  # all passages at once
    return sample_passages(model, data, EVAL_PASSAGES if n is None else n, seed, **settings)
