"""The microgpt tab's page (microgpt/commands/tab/static) in headless Chromium against a real
TensorBoard on the `lab` sweep, driven as a person would (docs/screenshots.py's Browser: clicks,
the slider); what it shows is checked against the library, not against the routes."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from docs.screenshots import CHROMIUM, NAMES, Browser, in_panels, page, tensorboard
from microgpt.checkpoint import Checkpoint
from microgpt.heads.circuits import replaced_heads
from microgpt.train.trainer import train
from tests.commands.conftest import seeded
from tests.conftest import REPO, TINY, compose_config

REGISTERED = any(e.name == "microgpt" for e in entry_points(group="tensorboard_plugins"))
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)"),
    pytest.mark.skipif(not REGISTERED, reason="no microgpt tab: pip install -e ."),
]
UNKNOWN = "input='Kalo!' has characters the vocabulary does not know: 'K', '!'"
HEADS2 = "sweep/heads=2"


GROUP = "seeds/heads=2"
ROLES = {1: ["previous", "self"], 2: ["previous", "previous"], 3: None}  # seed 3 not analysed


@pytest.fixture(scope="module")
def server(lab, tmp_path_factory):
    """A real TensorBoard on the lab's sweep, its text run, an attention-only text run of 8 heads
    reading 32 characters (wide/heads=8) and a group of 3 seeds (seeds/heads=2,seed=1..3:
    copies of heads=2, whose train.num_samples differs from the sweep's, so that it is not of
    their group) with the ROLES analysed."""
    wide = tmp_path_factory.mktemp("wide")
    text = ["data.format=text", "model.block_size=32", f"data.path={lab / 'play.txt'}", "heads=8"]
    out = [f"out_dir='{wide / 'heads=8'}'", "model.mlp=false"]
    train(compose_config([*TINY, *text, "train.num_samples=0", *out]))
    seeds = seeded(lab, tmp_path_factory.mktemp("seeds"), ROLES)
    for config in seeds.glob("*/config.yaml"):
        config.write_text(config.read_text().replace("num_samples: 0", "num_samples: 1"))
    spec = f"sweep:{lab / 'sweep'},text:{lab / 'text'},wide:{wide},seeds:{seeds}"
    with tensorboard(spec) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with Browser(1600, 1000) as browser:
        yield browser


def show(browser: Browser, url: str, condition: str = "true", **state: str) -> None:
    """Open the page with `state` in its URL; wait until every panel has answered."""
    browser.open(page(url, **state))
    browser.wait(in_panels(condition))


def panels(browser: Browser) -> dict:
    """{run: what its panel shows} (the text a person reads)."""
    return browser.eval("""Object.fromEntries([...document.querySelectorAll('.mg-panel')].map(
      (p) => [p.dataset.run, {
        heads: p.querySelectorAll('.mg-head').length,
        queries: [...p.querySelectorAll('.mg-query')].map((l) => l.textContent),
        pinned: p.querySelectorAll('.mg-query.mg-on[data-char="1"]').length,
        looks: [...p.querySelectorAll('.mg-head .mg-looks')].map((l) => l.textContent),
        unanalysed: p.querySelectorAll('.mg-unanalysed').length,
        meta: p.querySelector('.mg-meta').textContent,
        loss: p.querySelector('.mg-loss-value')?.textContent,
        loss_line: p.querySelector('.mg-loss').textContent,
        deltas: [...p.querySelectorAll('.mg-off-delta')].map((d) => d.textContent),
        roles: [...p.querySelectorAll('.mg-role')].map((r) => r.textContent),
        pins: p.querySelectorAll('.mg-pinned').length,
        top: Math.round(p.getBoundingClientRect().top),
        error: p.querySelector('.mg-error')?.textContent,
      }]))""")


def test_one_panel_per_run_with_every_head_and_the_pinned_character(server, browser):
    show(browser, server, input="kalo", q="1", runs="sweep/heads=1,sweep/heads=2")
    shown = panels(browser)
    assert list(shown) == ["sweep/heads=1", HEADS2]
    for run, panel in shown.items():
        heads = int(run.split("=")[1])
        assert panel["heads"] == heads  # 1 layer
        assert panel["queries"] == ["<s>", "k", "a", "l", "o"] * heads
        # q=1 pins the query "a": its row is highlighted and each head says where it looks
        assert panel["pinned"] == heads and all(looks.startswith("a→") for looks in panel["looks"])
    assert shown["sweep/heads=1"]["unanalysed"] == 1 and shown[HEADS2]["unanalysed"] == 0
    show(browser, server, input="Kalo!", runs="sweep/heads=1,sweep/heads=2")
    assert all(f"{run}: {UNKNOWN}" in panel["error"] for run, panel in panels(browser).items())


def library_loss(lab: Path, name: str, off: list[tuple[int, int]]) -> float:
    """The mean loss of heads=2's best.pt on `name` (and its end), the heads `off` zeroed through
    the analysis' own intervention (heads.circuits.replaced_heads)."""
    ckpt = Checkpoint.load(lab / "sweep" / "heads=2" / "checkpoints" / "best.pt")
    model, tokenizer = ckpt.build_model("cpu")
    ids = [0, *tokenizer.encode(name), 0]  # <s>name<s>: the boundary starts and ends it
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    drop = torch.zeros(model.config.n_layer, model.config.n_head, dtype=torch.bool)
    for layer, head in off:
        drop[layer, head] = True
    with torch.no_grad(), replaced_heads(model, drop):
        return float(model(x, y)[1])


def deltas(panel: dict) -> list[float | None]:
    """The loss change on the input shown beside each head (" input +0.123"), None where there
    is none."""
    return [float(d.removeprefix(" input ")) if d else None for d in panel["deltas"]]


def test_clicking_heads_off_changes_the_loss_by_what_the_library_computes(lab, server, browser):
    show(browser, server, input="kalo", runs=HEADS2)
    base = library_loss(lab, "kalo", [])
    assert abs(float(panels(browser)[HEADS2]["loss"]) - base) < 6e-4

    def click(layer: int, head: int, off: int) -> dict:
        selector = f".mg-head[data-layer='{layer}'][data-head='{head}'] .mg-caption"
        browser.eval(f'document.querySelector("{selector}").click()')
        browser.wait(f"document.querySelector('.mg-panel').result.off.length === {off}")
        return panels(browser)[HEADS2]

    one = click(0, 1, 1)
    alone = library_loss(lab, "kalo", [(0, 1)])
    assert alone != base and abs(float(one["loss"]) - alone) < 6e-4
    assert f"all heads on {base:.3f}" in one["loss_line"]
    assert deltas(one) == pytest.approx([None, alone - base], abs=6e-4)  # beside the head
    both = click(0, 0, 2)
    assert abs(float(both["loss"]) - library_loss(lab, "kalo", [(0, 0), (0, 1)])) < 6e-4
    first = library_loss(lab, "kalo", [(0, 0)])  # each head's change when it alone is off
    assert deltas(both) == pytest.approx([first - base, alone - base], abs=6e-4)
    state = urllib.parse.parse_qs(browser.eval("location.hash.slice(1)"))
    assert state[f"off:{HEADS2}"] == ["0.1,0.0"]  # a link that opens it so
    again = click(0, 1, 1)
    assert abs(float(again["loss"]) - library_loss(lab, "kalo", [(0, 0)])) < 6e-4
    browser.eval("document.querySelector('.mg-reset').click()")
    browser.wait("document.querySelector('.mg-panel').result.off.length === 0")
    assert abs(float(panels(browser)[HEADS2]["loss"]) - base) < 6e-4


def test_the_slider_moves_the_run_over_its_step_checkpoints(server, browser):
    show(browser, server, "document.querySelector('.mg-now')", input="kalo", runs=HEADS2)
    assert panels(browser)[HEADS2]["meta"].startswith("step 12 ")
    marker = "document.querySelector('.mg-now').getAttribute('x1')"
    at_best = browser.eval(marker)
    browser.eval("""(() => { const range = document.querySelector('.mg-slider');
      range.value = 0; range.dispatchEvent(new Event('input')); })()""")
    browser.wait("document.querySelector('.mg-panel').result.step === 6")
    shown = panels(browser)[HEADS2]
    assert shown["meta"].startswith("step 6 ") and browser.eval(marker) != at_best
    assert browser.eval("document.querySelector('.mg-slider-step').textContent") == "step 6"
    assert browser.eval("document.querySelector('.mg-checkpoint').value") == "step-000006.pt"


def test_no_pin_until_a_click_and_the_attribution_bars_sum_to_the_logit(server, browser):
    show(browser, server, input="kalo", runs=HEADS2)
    assert panels(browser)[HEADS2]["pins"] == 0 and not browser.eval("location.hash.includes('q=')")
    note = browser.eval("document.querySelector('.mg-attribution .mg-note').textContent")
    assert note.startswith("click a character to pin it")
    browser.eval("document.querySelector('.mg-position[data-position=\"2\"]').click()")  # 'a'
    browser.wait("document.querySelector('.mg-part')")
    waterfall = """(() => {
      const rows = [...document.querySelectorAll('.mg-part')];
      const edge = (row, end) => {
        const box = row.querySelector('.mg-up, .mg-down').getBoundingClientRect();
        return (end === (+row.dataset.value >= 0)) ? box.right : box.left; };
      const total = rows.pop();
      return {names: rows.map((r) => r.querySelector('.mg-part-name').textContent),
              values: rows.map((r) => +r.dataset.value),
              heads: [...document.querySelectorAll('.mg-dla')].map((d) => +d.dataset.value),
              logit: document.querySelector('.mg-logit').textContent,
              title: document.querySelector('.mg-attribution-title').textContent,
              reading: document.querySelector('.mg-attribution .mg-reading')?.textContent,
              last_end: edge(rows[rows.length - 1], true), total_end: edge(total, true),
              first_start: edge(rows[0], false), total_start: edge(total, false)};
    })()"""
    parts = browser.eval(waterfall)
    assert parts["title"].startswith("logit of 'l' after 'a' = ")  # "a" pinned: "l" follows
    assert parts["names"] == ["embeddings", "L0 H0", "L0 H1", "MLP 0", "rest"]
    assert abs(sum(parts["values"]) - float(parts["logit"])) <= 0.006  # shown to 2 decimals
    assert parts["heads"] == parts["values"][1:3]  # each head's bar, the same parts
    # the waterfall: each bar starts where the last ended, the last ends where the logit's does
    assert abs(parts["last_end"] - parts["total_end"]) < 1.5
    assert abs(parts["first_start"] - parts["total_start"]) < 1.5
    assert parts["reading"].startswith("L0H")  # the reading of the largest head
    browser.eval("document.querySelector('.mg-sort').click()")
    by_size = browser.eval(waterfall)
    assert sorted(map(abs, by_size["values"]), reverse=True) == list(map(abs, by_size["values"]))
    assert abs(by_size["last_end"] - by_size["total_end"]) < 1.5


def test_four_runs_fit_1600_px_and_an_attention_only_run_has_no_mlp_rows(server, browser):
    show(browser, server, "panels.every((p) => p.querySelector('.mg-part'))", input="kalo", q="2")
    shown = panels(browser)  # every group: names, text, 8 heads (attention-only), 3 seeds
    assert list(shown)[:4] == ["sweep/heads=1", HEADS2, "text/run", "wide/heads=8"]
    assert len({panel["top"] for panel in list(shown.values())[:4]}) == 1  # side by side
    assert browser.eval("document.documentElement.scrollWidth") <= 1600
    rows = """[...document.querySelectorAll('.mg-panel[data-run="RUN"] .mg-part-name')]
      .map((n) => n.textContent)"""
    assert "MLP 0" in browser.eval(rows.replace("RUN", HEADS2))
    names = browser.eval(rows.replace("RUN", "wide/heads=8"))
    assert "L0 H7" in names and not any(name.startswith("MLP") for name in names)
    line = "Thou art my lord and the king.\n\n"  # the whole context of the 8 heads' run (32)
    show(browser, server, input=line, runs="wide/heads=8")
    assert not panels(browser)["wide/heads=8"].get("error")
    assert browser.eval("document.documentElement.scrollWidth") <= 1600
    strip = "document.querySelector('.mg-predictions')"
    assert browser.eval(f"{strip}.scrollWidth > {strip}.clientWidth")  # it scrolls inside
    browser.eval("document.querySelector('.mg-open').click()")
    browser.wait("document.querySelector('.mg-large .mg-query')")  # labelled, large
    size = browser.eval("parseFloat(getComputedStyle(document.querySelector('.mg-large .mg-key'))"
                        ".fontSize)")  # fmt: skip
    assert size >= 12  # readable


def test_a_group_shows_seed_by_seed_with_its_roles_counted_over_its_seeds(server, browser):
    show(browser, server, input="kalo", runs=GROUP)
    ((run, panel),) = panels(browser).items()  # one panel for the group's 3 runs
    assert run == f"{GROUP},seed=1" and panel["meta"].startswith(f"{GROUP},seed=1 · step 12")
    # seed 1's heads: previous (in seeds 1 and 2), self (in seed 1); seed 3 is not analysed
    assert panel["roles"][0].startswith("previous2 of 2 seeds analysed")
    assert panel["roles"][1].startswith("self1 of 2 seeds analysed")
    seeds = "[...document.querySelectorAll('.mg-seed')]"
    assert browser.eval(f"{seeds}.map((b) => b.textContent)") == ["1", "2", "3"]
    browser.eval(f"{seeds}[2].click()")
    browser.wait(f"document.querySelector('.mg-panel').result?.run === '{GROUP},seed=3'")
    ((run, panel),) = panels(browser).items()
    assert run == f"{GROUP},seed=3" and panel["unanalysed"] == 2
    assert urllib.parse.parse_qs(browser.eval("location.hash.slice(1)"))[f"seed:{GROUP}"] == ["3"]


def test_the_view_is_kept_in_tensorboards_address_bar_and_restored_from_it(server, browser):
    run = f"{GROUP},seed=2"
    state = {"input": "kalo", "runs": GROUP, f"seed:{GROUP}": "2", "q": "1", f"off:{run}": "0.1",
             "ablation": "mean", f"checkpoint:{run}": "step-000006.pt"}  # fmt: skip
    browser.open(f"{server}/#microgpt&{urllib.parse.urlencode(state)}")
    frame = "document.querySelector('iframe')?.contentDocument"
    browser.wait(f"{frame}?.querySelector('.mg-panel')?.result", 60)
    result = browser.eval(f"{frame}.querySelector('.mg-panel').result")
    assert (result["run"], result["checkpoint"], result["step"]) == (run, "step-000006.pt", 6)
    assert (result["off"], result["ablation"], result["pin"]) == ([[0, 1]], "mean", 2)  # <s>ka
    assert browser.eval(f"{frame}.querySelector('.mg-input').value") == "kalo"
    browser.eval(f"{frame}.querySelector('.mg-reset').click()")  # all heads on again
    browser.wait(f"{frame}.querySelector('.mg-panel').result.off.length === 0")
    top = browser.eval("location.hash")
    assert top.startswith("#microgpt&")  # TensorBoard's tab, then the page's state
    assert urllib.parse.parse_qs(top.removeprefix("#microgpt&")) == {
        k: [v] for k, v in state.items() if not k.startswith("off:")}  # fmt: skip


def test_the_screenshot_script_shoots_every_view_into_its_own_names(lab, tmp_path):
    spec = f"sweep:{lab / 'sweep'},text:{lab / 'text'}"
    (tmp_path / "keep.png").write_bytes(b"not ours")
    command = [sys.executable, str(REPO / "docs" / "screenshots.py"), "--sweep", spec]
    command += ["--line", "Thou art my lord"]  # what the lab's text run reads (16 characters)
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*NAMES, "keep.png"])
    assert (tmp_path / "keep.png").read_bytes() == b"not ours"
    for name in NAMES:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"{tmp_path / name}: {NAMES[name]}" in done.stdout
