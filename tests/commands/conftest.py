"""Fixtures of the commands' tests: `lab`, a tiny sweep and a text run for the microgpt tab;
`seeded`: a group of its runs that differ only by seed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from microgpt.commands.heads import main as heads_main
from microgpt.train.trainer import train
from tests.conftest import TINY, compose_config, make_names

PLAY = "ROMEO:\nThou art my lord and the king.\n\nJULIET:\nSo fair a night of love.\n" * 40


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Path:
    """lab/sweep/heads=1 and heads=2 (names; heads=2 keeps step-000006.pt and step-000012.pt, and
    best.pt and step-000006.pt are analysed) and lab/text/run (a text run): tiny runs, a few
    seconds in all. Shared by every test: copy before changing."""
    root = tmp_path_factory.mktemp("lab")
    (root / "names.txt").write_text("\n".join(make_names()) + "\n")
    (root / "play.txt").write_text(PLAY)
    names = [*TINY, f"data.path={root / 'names.txt'}", "train.num_samples=0"]
    train(compose_config([*names, "heads=1", f"out_dir='{root / 'sweep' / 'heads=1'}'"]))
    heads2 = root / "sweep" / "heads=2"
    train(compose_config([*names, "heads=2", "train.save_every=6", f"out_dir='{heads2}'"]))
    assert heads_main([str(heads2), "--threads", "1"]) == 0
    assert heads_main([str(heads2 / "checkpoints" / "step-000006.pt"), "--threads", "1"]) == 0
    text = ["data.format=text", "model.block_size=16", f"data.path={root / 'play.txt'}"]
    train(compose_config([*TINY, *text, "train.num_samples=0", f"out_dir={root / 'text' / 'run'}"]))
    return root


def seeded(lab: Path, folder: Path, roles: dict[int, list[str] | None]) -> Path:
    """`folder`/heads=2,seed=S for each seed S of `roles`: copies of the lab's heads=2 whose
    config.yaml says seed S, with a best.pt analysis whose heads (layer 0) have those roles (None:
    not analysed)."""
    for seed, heads in roles.items():
        run = folder / f"heads=2,seed={seed}"
        shutil.copytree(lab / "sweep" / "heads=2", run)
        config = (run / "config.yaml").read_text()
        (run / "config.yaml").write_text(re.sub(r"(?m)^seed: .*$", f"seed: {seed}", config))
        for analysis in run.glob("heads-*.json"):
            analysis.unlink()
        if heads is not None:
            rows = [{"layer": 0, "head": h, "role": role} for h, role in enumerate(heads)]
            analysis = {"n_layer": 1, "n_head": 2, "heads": rows}
            (run / "heads-best.json").write_text(json.dumps(analysis))
    return folder
