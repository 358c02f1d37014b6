"""The figures README.md and docs/ quote are the ones their commands wrote: docs/figures.json
(bench/figures.py: each README recipe's run, analysis and compare table, with its command, seed,
threads, machine and date) and the bench JSON that docs/benchmarks.md names."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

FIGURES = json.loads((REPO / "docs" / "figures.json").read_text())
BENCH = json.loads((REPO / "docs" / "benchmarks-time-to-loss.json").read_text())

# (doc, a passage with {recipe.figure} or {recipe.date} fields): in the doc, whitespace aside
QUOTES = [
    ("README.md", "reaches a test loss of **{names-seeds.test_loss_mean}** nats per character,"
     " the mean over seeds 1 to 5 with one thread (standard deviation {names-seeds.test_loss_sd};"
     " 95% interval of the mean {names-seeds.test_loss_ci_low} to"
     " {names-seeds.test_loss_ci_high}; {names-seeds.date})"),
    ("README.md", "gives exactly **{names.test_loss}** with one thread ({names.date})"),
    ("README.md", "**{names-as-typed.test_loss}** in **{names-as-typed.seconds} s** as typed"
     " (threads=auto measured one thread the fastest and took it; {names-as-typed.date}), on a"
     " 2-core {names.cpu} with AVX512-BF16 and no AMX, no GPU, nothing else running (one thread:"
     " {names.seconds} s; with another training on the other core:"
     " {names-as-typed-busy.seconds} s as typed, {names-busy.seconds} s at one thread)"),
    ("README.md", "train.pack=0`; makemore's transformer of the same size reaches 2.00 on its"
     " names.txt) reaches {adamw.test_loss}"),
    ("README.md", "{sweep.seconds} s for the 12 runs on 2 cores, {sweep.date})"),
    ("README.md", "{sweep.table}"),
    ("README.md", "the text recipe: {shakespeare.seconds} s on one core"),
    ("README.md", "about {names-as-typed.seconds} s, the study of 12 runs (`-m"
     " experiment=heads_seeds hydra/launcher=joblib`) {sweep.seconds} s on 2 cores"),
    ("docs/heads.md", "no AMX: bf16; one thread a job, two jobs at once; {sweep.date};"),
    ("docs/heads.md", "test loss {names-ns.test_loss}, best validation {names-ns.best_val_loss}"),
    ("docs/heads.md", "{names-ns.table}"),
    ("docs/heads.md", "{sweep.table}"),
    ("docs/heads.md", "{shakespeare-ns.table}"),
    ("docs/guide.md", "a validation loss of **{shakespeare.best_val_loss}** nats per character"),
    ("docs/guide.md", "a test loss of **{shakespeare.test_loss}**"),
    ("docs/guide.md", "Over seeds 1, 2 and 3 its test loss is"
     " **{shakespeare-seeds.test_loss_mean}** on average (standard deviation"
     " {shakespeare-seeds.test_loss_sd}; 95% interval of the mean"
     " {shakespeare-seeds.test_loss_ci_low} to {shakespeare-seeds.test_loss_ci_high};"
     " {shakespeare-seeds.date},"),
]  # fmt: skip

# (doc, a passage with {figure name of docs/benchmarks-time-to-loss.json's time_to_loss})
TIME_TO_LOSS = [
    ("README.md", "final loss (AdamW, padded rows, float32: {names: reference's final val"
     " loss:.3f}, reached in {names: reference's wall time to it:.0f} s) in {names:"
     " microgpt's wall time to the reference's:.0f} s, **{names: reference's time /"
     " microgpt's:.1f}x** sooner"),
    ("README.md", "final loss ({text: reference's final val loss:.3f} in {text: reference's wall"
     " time to it:.0f} s) in {text: microgpt's wall time to the reference's:.0f} s, **{text:"
     " reference's time / microgpt's:.1f}x** sooner"),
    ("README.md", "at the first evaluation at or below it, {names: the same at the first"
     " evaluations at or below it:.1f}x and {text: the same at the first evaluations at or"
     " below it:.1f}x"),
    ("README.md", "as {names: steps to it, reference's / microgpt's:.1f}x and {text: steps to it,"
     " reference's / microgpt's:.1f}x fewer steps, each step {names: step time, reference's /"
     " microgpt's:.2f}x and {text: step time, reference's / microgpt's:.2f}x cheaper (the two"
     " alternated in one process), the same speed-ups are {names: steps ratio x step time"
     " ratio:.1f}x and {text: steps ratio x step time ratio:.1f}x"),
]  # fmt: skip


def squeezed(text: str) -> str:
    return " ".join(text.split())


def figure(field: str) -> str:
    """{recipe.figure}: the text bench/figures.py wrote for it; {recipe.date}: when it ran;
    {recipe.cpu}: on what."""
    recipe, name = field.split(".", 1)
    made = FIGURES[recipe]["made_by"]
    if name in ("date", "cpu"):
        return made["date"] if name == "date" else made["machine"]["cpu"]
    return FIGURES[recipe]["figures"][name]["text"]


@pytest.mark.parametrize("doc, passage", QUOTES, ids=[f"{d}:{p[:40]}" for d, p in QUOTES])
def test_a_quoted_figure_is_the_one_its_command_wrote(doc, passage):
    expected = re.sub(r"\{([\w.-]+)\}", lambda m: figure(m[1]), passage)
    assert squeezed(expected) in squeezed((REPO / doc).read_text())


@pytest.mark.parametrize("doc, passage", TIME_TO_LOSS, ids=[p[:40] for _, p in TIME_TO_LOSS])
def test_the_time_to_a_loss_is_the_benchs(doc, passage):
    figures = BENCH["sections"]["time_to_loss"]["figures"]
    figure_at = lambda m: f"{figures[m[1]]['median']:{m[2]}}"  # noqa: E731 -- {name:format}
    quoted = re.sub(r"\{([^{}]+):([^:{}]+)\}", figure_at, passage)
    assert squeezed(quoted) in squeezed((REPO / doc).read_text())


def test_every_figure_says_how_it_was_made():
    for name, entry in FIGURES.items():
        made = entry["made_by"]
        assert {"command", "seed", "threads", "date", "machine", "commit"} <= set(made), name
        assert not made.get("quick"), f"{name}: a --quick run is a smoke test, not a figure"
    # the figures the README gives as exact or as a spread name the bf16 instructions they hold on
    for name in ("names", "names-seeds", "sweep"):
        assert FIGURES[name]["made_by"]["machine"]["bf16_instructions"] == ["avx512_bf16"]
