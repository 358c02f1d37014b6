"""A sweep's seeds as bands (microgpt.viz.bands): the mean and the min-to-max band of each group
against hand-computed values, read back with TensorBoard's EventAccumulator; the margin charts;
no run's file touched; what it refuses to replace; the sweep's callback; the charts in a real
TensorBoard and Chromium."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from tensorboard.plugins.custom_scalar import layout_pb2

from microgpt.cli import SeedBands
from microgpt.runs import RunFolder
from microgpt.viz.bands import CATEGORY, BandsError, write_bands
from tests.conftest import read_events
from tests.e2e.harness import changes, fingerprint

# {run: (its config, its metrics.jsonl lines)}: heads=2 over seeds 1, 2, 3 (seed 3 stopped before
# step 12), heads=4 over seeds 1, 2, heads=8 over seed 1 alone (no band)
T, V, STATS = "Loss/train", "Loss/val", ("mean", "min", "max")
RUNS = {
    "heads=2,seed=1": (2, 1, [{"step": 0, "time": 100.0, T: 3.0},
                              {"step": 6, "time": 160.0, T: 2.5, V: 2.75},
                              {"step": 12, "time": 220.0, T: 2.0, V: 2.5}]),
    "heads=2,seed=2": (2, 2, [{"step": 0, "time": 200.0, T: 3.5},
                              {"step": 6, "time": 260.0, T: 2.0, V: 2.25},
                              {"step": 12, "time": 320.0, T: 1.5, V: 2.0}]),
    "heads=2,seed=3": (2, 3, [{"step": 0, "time": 300.0, T: 4.75},
                              {"step": 6, "time": 360.0, T: 3.5, V: 3.5}]),
    "heads=4,seed=1": (4, 1, [{"step": 6, "time": 10.0, T: 1.0, V: 2.0}]),
    "heads=4,seed=2": (4, 2, [{"step": 6, "time": 20.0, T: 2.0, V: 2.5}]),
    "heads=8,seed=1": (8, 1, [{"step": 6, "time": 10.0, T: 1.0, V: 2.0}]),
}  # fmt: skip
# by hand: {group: {loss: [(step, mean, min, max), ...]}}; heads=2's val mean (2.75 + 2.25 + 3.5)
# / 3 (not the median, 2.75, nor the middle, 2.875); step 12: not in seed 3
BY_HAND = {
    "heads=2": {V: [(6, 8.5 / 3, 2.25, 3.5)], T: [(0, 11.25 / 3, 3.0, 4.75), (6, 8 / 3, 2.0, 3.5)]},
    "heads=4": {V: [(6, 2.25, 2.0, 2.5)], T: [(6, 1.5, 1.0, 2.0)]},
}
EXPECTED = {  # {group: {tag: [(step, value), ...]}}
    group: {f"seeds/{loss}/{stat}": [(p[0], p[k]) for p in points]
            for loss, points in losses.items() for k, stat in enumerate(STATS, 1)}
    for group, losses in BY_HAND.items()
}  # fmt: skip
MARGIN = {  # the margin charts: title -> (mean, lower, upper)
    f"{loss}: mean over seeds, band min to max": tuple(f"seeds/{loss}/{s}" for s in STATS)
    for loss in (V, T)
}
MARGIN_TAGS = list(MARGIN.values())


def make_sweep(root: Path, runs: dict = RUNS) -> Path:
    """Run folders as a sweep leaves them (config.yaml, metrics.jsonl, an event file) in root."""
    for name, (heads, seed, lines) in runs.items():
        run = root / name
        run.mkdir(parents=True)
        config = {"seed": seed, "heads": heads, "model": {"n_head": heads}, "out_dir": str(run)}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (run / "metrics.jsonl").write_text(text + '{"step": 99, "Loss/tr')  # cut by a crash
        (run / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    return root


def test_each_group_of_seeds_is_a_run_with_its_mean_and_band_and_no_run_changes(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    before = fingerprint(sweep)
    written = write_bands(sweep)
    assert [(g.name, g.seeds) for g in written] == [("heads=2", [1, 2, 3]), ("heads=4", [1, 2])]
    changed, removed, added = changes(before, fingerprint(sweep))
    assert not changed and not removed
    assert all(p.startswith("groups") for p in added), added
    groups = sweep / "groups"
    assert sorted(p.name for p in groups.iterdir()) == ["groups.json", "heads=2", "heads=4"]
    made = json.loads((groups / "groups.json").read_text())["groups"]
    assert made["heads=2"] == {
        "runs": ["heads=2,seed=1", "heads=2,seed=2", "heads=2,seed=3"],
        "seeds": [1, 2, 3],
    }
    for group, expected in EXPECTED.items():
        acc = read_events(groups / group)
        assert set(acc.Tags()["scalars"]) == set(expected)  # no Loss/val: the jobs' tag alone
        for tag, points in expected.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            assert got == [(s, pytest.approx(v, rel=1e-6)) for s, v in points], (group, tag)
    # the wall time: the runs' mean (so the relative time is the mean time the seeds took)
    assert [e.wall_time for e in read_events(groups / "heads=2").Scalars(MARGIN_TAGS[1][0])] == [
        200.0, 260.0]  # fmt: skip
    # the layout: a margin chart per loss, one series (each group run draws one line and band)
    events = read_events(groups / "heads=4").Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(events[0].tensor_proto.string_val[0])
    charts = {c.title: c for cat in layout.category for c in cat.chart}
    assert set(charts) == set(MARGIN)
    for title, tags in MARGIN.items():
        series = charts[title].margin.series
        assert [(s.value, s.lower, s.upper) for s in series] == [tags]


def test_a_sweep_without_seeds_writes_nothing(tmp_path):
    runs = {k: v for k, v in RUNS.items() if k.endswith("seed=1")}
    sweep = make_sweep(tmp_path / "sweep", runs)
    before = fingerprint(sweep)
    assert write_bands(sweep) == []
    assert changes(before, fingerprint(sweep)) == ([], [], [])


def test_a_second_call_replaces_its_own_groups_and_nothing_else(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    write_bands(sweep)
    write_bands(sweep)  # one event file per group: TensorBoard would read both, twice the points
    groups = sweep / "groups"
    assert len(list((groups / "heads=2").iterdir())) == 1
    assert [e.step for e in read_events(groups / "heads=2").Scalars(MARGIN_TAGS[0][0])] == [6]
    # a file it did not write, in a folder it made: refused, and kept
    mine = groups / "heads=2" / "notes.txt"
    mine.write_text("mine")
    before = fingerprint(sweep)
    with pytest.raises(BandsError, match=r"did not write \(heads=2\)"):
        write_bands(sweep)
    assert changes(before, fingerprint(sweep)) == ([], [], [])
    assert not [p for p in sweep.iterdir() if p.name.startswith(".")]  # no leftovers
    mine.unlink()
    for job in [p for p in sweep.iterdir() if p.name.endswith(("seed=2", "seed=3"))]:
        shutil.rmtree(job)  # one seed left in each group
    assert write_bands(sweep) == [] and not groups.exists()  # its bands went with it


@pytest.mark.parametrize("kind", ["folder", "link", "file"])
def test_a_groups_folder_it_did_not_make_is_never_replaced(tmp_path, kind):
    sweep = make_sweep(tmp_path / "sweep")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "groups.json").write_text('{"made_by": "microgpt.viz.bands", "groups": {}}')
    if kind == "folder":  # the user's, with a file that looks like ours
        (sweep / "groups").mkdir()
        (sweep / "groups" / "groups.json").write_text('{"made_by": "me", "groups": {"a": 1}}')
    elif kind == "link":
        (sweep / "groups").symlink_to(elsewhere)
    else:
        (sweep / "groups").write_text("a file")
    before, outside = fingerprint(sweep), fingerprint(elsewhere)
    with pytest.raises(BandsError, match=r"groups (was not made|is a link|is a file)"):
        write_bands(sweep)
    assert changes(before, fingerprint(sweep)) == ([], [], [])
    assert fingerprint(elsewhere) == outside


def test_the_callback_warns_in_one_line_and_never_fails_the_sweep(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    (sweep / "groups").mkdir()  # not ours: the bands cannot be written
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    SeedBands().on_multirun_end(config)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.match(r"microgpt: warning: no seed bands: .*groups", err[0]), err
    (sweep / "groups").rmdir()
    SeedBands().on_multirun_end(config)
    assert (sweep / "groups" / "heads=4").is_dir() and not capsys.readouterr().err


def test_of_two_sweeps_started_into_one_folder_the_second_stops(tmp_path, capsys):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    SeedBands().on_multirun_start(config)  # both passed the start-up check: the claim decides
    claim = (tmp_path / "sweep" / "sweep.json").read_bytes()
    with pytest.raises(SystemExit) as stop:
        SeedBands().on_multirun_start(config)
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "another sweep claimed it first" in err[0]
    assert (tmp_path / "sweep" / "sweep.json").read_bytes() == claim


def test_a_real_seed_sweep_ends_with_its_bands(tmp_path, names_file):
    """`python train.py -m seed=1,2` through Hydra (in this process): the callback writes the
    group's bands, from what the two runs logged."""
    from tests.conftest import TINY
    from tests.e2e.harness import run

    sweep = tmp_path / "sweep"
    small = [a for a in TINY if not a.startswith("train.max_steps")] + ["train.max_steps=6"]
    args = ["-m", "seed=1,2", *small, f"data.path={names_file}", f"hydra.sweep.dir={sweep}"]
    r = run("train.py", *args, cwd=tmp_path)
    assert r.code == 0 and "Traceback" not in r.text, r.text[-3000:]
    assert "warning" not in r.stderr, r.stderr
    jobs = [sweep / "seed=1", sweep / "seed=2"]
    val = [{m["step"]: m[V] for m in RunFolder(j).metrics() if V in m} for j in jobs]
    acc = read_events(sweep / "groups" / "all")  # seed alone swept: one group, "all"
    assert [e.step for e in acc.Scalars("seeds/Loss/val/mean")] == sorted(val[0])
    for e in acc.Scalars("seeds/Loss/val/max"):
        assert e.value == pytest.approx(max(v[e.step] for v in val), rel=1e-6)


# ----------------------------------------------------------------------------- in the browser


@pytest.mark.slow
def test_the_custom_scalars_tab_draws_one_line_with_a_band_per_group(tmp_path):
    """A real TensorBoard on the sweep: the Custom Scalars tab has the two margin charts, each
    drawing one line (and band) per group of seeds, from the group runs alone."""
    from docs.screenshots import CHROMIUM, Browser, tensorboard

    if CHROMIUM is None:
        pytest.skip("no chromium (apt-get install chromium)")
    sweep = make_sweep(tmp_path / "sweep")
    write_bands(sweep)
    with tensorboard(str(sweep)) as url:

        def get(route: str, **query) -> dict:
            q = urllib.parse.urlencode(query)
            with urllib.request.urlopen(f"{url}/data/plugin/custom_scalars/{route}?{q}") as r:
                return json.load(r)

        deadline = time.monotonic() + 60  # TensorBoard reads the runs after it starts
        while CATEGORY not in str(layout := get("layout")) and time.monotonic() < deadline:
            time.sleep(0.2)
        charts = {c["title"]: c for cat in layout["category"] for c in cat["chart"]}
        for title, tags in MARGIN.items():
            assert [tuple(s.values()) for s in charts[title]["margin"]["series"]] == [tags]
        # what each run answers to the chart's request (its tags as one regex): the group runs
        runs = ["groups/heads=2", "groups/heads=4", *RUNS]
        regex = "|".join(f"({re.escape(t)})" for t in MARGIN_TAGS[0])
        drawn = [r for r in runs if get("scalars", run=r, tag=regex)["tag_to_events"]]
        assert drawn == ["groups/heads=2", "groups/heads=4"]
        with Browser(1600, 1000) as browser:  # the tab, as a person opens it
            browser.open(f"{url}/#custom_scalars")
            drawn = f"{CARDS}.every((card) => {MATCHES}.length >= 2 && {AREAS}.length >= 2)"
            browser.wait(f"{CARDS}.length === 2 && {drawn}", 60)
            shown = browser.eval(f"""{CARDS}.map((card) => [card.title, {MATCHES}.map(
              (e) => e.textContent.replace('\u25fc', '').trim()), {AREAS}.length])""")
            browser.screenshot(tmp_path / "custom_scalars.png")  # to look at when it fails
    for title, matches, areas in shown:
        value = MARGIN[title][0]  # each group's mean (its line) and band (its area), none else
        assert sorted(matches) == [f"{value} (groups/heads=2)", f"{value} (groups/heads=4)"]
        assert areas == 2, title


# every element under `root`, through shadow roots; the margin cards; what a card lists it draws
# (a line per run and series: "seeds/Loss/val/mean (groups/heads=2)"); the bands it fills
EVERYTHING = """((root) => { const out = []; const walk = (n) => { out.push(n);
  [...n.children, ...(n.shadowRoot ? n.shadowRoot.children : [])].forEach(walk); };
  if (root) walk(root); return out; })"""
CARD = "tf-custom-scalar-margin-chart-card"
CARDS = f"{EVERYTHING}(document.documentElement).filter((n) => n.localName === '{CARD}')"
MATCHES = "[...card.shadowRoot.querySelectorAll('.match-list-entry')]"
AREAS = f"{EVERYTHING}(card).filter((n) => n.localName === 'path' && n.classList.contains('area'))"
