"""The figures README.md and docs/ quote are the ones their commands wrote: docs/figures.json
(bench/figures.py: each README recipe's run, analysis and compare table, with its command, seed,
threads, machine and date) and the bench JSON that docs/benchmarks.md names."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

FIGURES = json.loads((REPO / "docs" / "figures.json").read_text())

# (doc, a passage with {recipe.figure} or {recipe.date} fields): in the doc, whitespace aside
QUOTES = [
    ("README.md", "{sweep-5.table-columns}"),  # compare's table, its legend left out
    ("README.md", "seed=1,2,3,4,5` (today's default, one thread a job, on an {sweep-5.cpu-kind},"
     " {sweep-5.date})"),
    ("README.md", "the text recipe: {shakespeare.seconds} s on one core"),
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

BENCH = {kind: json.loads((REPO / "docs" / f"benchmarks-time-to-loss{kind}.json").read_text())
         for kind in ("", "-fp32", "-amx")}  # fmt: skip


def speed(kind: str) -> list[str]:
    """A speed row's cells from docs/benchmarks-time-to-loss<kind>.json: names' and text's
    speed-ups, then the step ratios."""
    to, step = "reference's time / microgpt's:.1f", "step time, reference's / microgpt's:.2f"
    apart = "steps ratio x step time ratio"
    cells = [f"**{{{kind}|{c}: {apart}:.1f}}x** [{{{kind}|{c}: {apart}@min:.1f}}-"
             f"{{{kind}|{c}: {apart}@max:.1f}}]; wall {{{kind}|{c}: {to}}}x"
             for c in ("names", "text")]  # fmt: skip
    return [*cells, f"{{{kind}|names: {step}}}, {{{kind}|text: {step}}}"]


# (doc, the start of a table row, the figures its cells hold: {recipe.figure} of docs/figures.json,
# {kind|figure name:format} of docs/benchmarks-time-to-loss<kind>.json): figures, not prose
ROWS = [
    ("README.md", "test loss, mean", ["{names-seeds.test_loss_mean}", "{names-seeds.test_loss_sd}",
     "{names-seeds.test_loss_ci_low} to {names-seeds.test_loss_ci_high}", "{names-seeds.date}"]),
    ("README.md", "`python train.py heads=4` |", ["about {names-as-typed.seconds} s",
     "{names-as-typed.date}"]),
    ("README.md", "the study of 12 runs", ["{sweep.seconds} s", "{sweep.date}"]),
    ("README.md", "`python train.py experiment=shakespeare`, one core",
     ["{shakespeare.seconds} s", "{shakespeare.date}"]),
    ("README.md", "test loss, the default seed", ["{names.test_loss}", "{names.date}"]),
    ("README.md", "the recipe before Muon", ["{adamw.test_loss}", "{adamw.date}"]),
    ("README.md", "AMD EPYC, AVX512-BF16", ["{names-as-typed.seconds} s", "{names-as-typed.cpu}",
     *speed("")]),
    ("README.md", "Intel Xeon, AMX: bf16", ["{names-as-typed-amx.seconds} s",
     "{names-as-typed-amx.date}", *speed("-amx")]),
    ("README.md", "Intel Xeon, AMX, forced fp32", ["{names-fp32.seconds} s", "{names-fp32.date}",
     *speed("-fp32")]),
]  # fmt: skip


def squeezed(text: str) -> str:
    return " ".join(text.split())


def figure(field: str) -> str:
    """{recipe.figure}: the text bench/figures.py wrote for it; {recipe.date}: when it ran;
    {recipe.cpu}: on what."""
    recipe, name = field.split(".", 1)
    made = FIGURES[recipe]["made_by"]
    if name == "table-columns":  # the table less the lines that say what each column means
        legend = re.compile(r"(group:|best val:|--runs|verdicts:|  (?!heads=)\S)")
        table = FIGURES[recipe]["figures"]["table"]["text"].splitlines()
        return "\n".join(line for line in table if not legend.match(line))
    if name == "cpu-kind":  # "Intel(R) Xeon(R) Processor" -> "Intel Xeon"
        return " ".join(made["machine"]["cpu"].replace("(R)", "").split()[:2])
    if name in ("date", "cpu"):
        return made["date"] if name == "date" else made["machine"]["cpu"]
    return FIGURES[recipe]["figures"][name]["text"]


@pytest.mark.parametrize("doc, passage", QUOTES, ids=[f"{d}:{p[:40]}" for d, p in QUOTES])
def test_a_quoted_figure_is_the_one_its_command_wrote(doc, passage):
    expected = re.sub(r"\{([\w.-]+)\}", lambda m: figure(m[1]), passage)
    assert squeezed(expected) in squeezed((REPO / doc).read_text())


def bench_figure(kind: str, name: str, fmt: str) -> str:
    """name@min / name@max: the figure's range over its rounds; name alone: its median."""
    name, _, stat = name.partition("@")
    figures = BENCH[kind]["sections"]["time_to_loss"]["figures"]
    return f"{figures[name][stat or 'median']:{fmt}}"


def filled(text: str) -> str:
    """{recipe.figure} and {kind|name:format} replaced by the figures their JSON holds."""
    text = re.sub(r"\{([^{}|]*)\|([^{}]+):([^:{}]+)\}", lambda m: bench_figure(*m.groups()), text)
    return re.sub(r"\{([\w.-]+)\}", lambda m: figure(m[1]), text)


@pytest.mark.parametrize("doc, start, cells", ROWS, ids=[f"{d}:{r}" for d, r, _ in ROWS])
def test_a_table_row_holds_the_figures_its_commands_wrote(doc, start, cells):
    lines = (REPO / doc).read_text().splitlines()
    (row,) = [line for line in lines if line.startswith(f"| {start}")]
    for cell in cells:
        assert filled(cell) in row, (cell, row)
    if "forced fp32" in start:  # the fp32 figures were made with fp32 forced
        assert "train.precision=fp32" in FIGURES["names-fp32"]["made_by"]["command"]
        assert "--row-override optim.muon_precision=fp32" in BENCH["-fp32"]["command"]


def test_every_figure_says_how_it_was_made():
    for name, entry in FIGURES.items():
        made = entry["made_by"]
        assert {"command", "seed", "threads", "date", "machine", "commit"} <= set(made), name
        assert not made.get("quick"), f"{name}: a --quick run is a smoke test, not a figure"
    # the figures the README gives as exact or as a spread name the bf16 instructions they hold on
    for name in ("names", "names-seeds", "sweep"):
        assert FIGURES[name]["made_by"]["machine"]["bf16_instructions"] == ["avx512_bf16"]
