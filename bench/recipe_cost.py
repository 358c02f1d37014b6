"""The cost of recipes against the default before issue 27, alone, in one process:

    python bench/recipe_cost.py [--threads N] [--loop] [RECIPE ...]   # RECIPE: overrides, ','

Each recipe's training step (--loop: the whole step of Trainer.run's loop, evaluations excluded)
is alternated with the pinned old default's (bench/cost.py), and the step ratio, the run's cost
in old default runs and the ratio of real characters/s are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cost import DEFAULT_RECIPE, cost_ratio  # noqa: E402

RECIPES = [
    "heads=4,train.pack=32",
    "heads=4,optim=muon,train.ema=0.995",
    "heads=4,optim=muon,train.ema=0.995,train.pack=32",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipes", nargs="*", default=RECIPES)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--loop", action="store_true", help="time Trainer.run's whole step")
    a = p.parse_args()
    args = argparse.Namespace(device="cpu", threads=a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in a.recipes:
            c = cost_ratio(recipe.split(","), args, Path(tmp), a.rounds, 1.0, loop=a.loop)
            rows.append({"recipe": recipe, "unit": " ".join(DEFAULT_RECIPE), **c})
            print(
                f"{recipe:40s} step x{c['step_ratio']:.3f} (rounds {min(c['ratios']):.3f}-"
                f"{max(c['ratios']):.3f}), run cost {c['run_cost']:.2f}, characters/s "
                f"x{c['chars_ratio']:.2f}, default step {c['default_step_s'] * 1e3:.1f} ms"
                f"{' (busy)' if c['busy'] else ''}",
                flush=True,
            )
    keys = ("recipe", "unit", "step_ratio", "ratios", "chars_ratio")
    print(json.dumps([{k: r[k] for k in keys} for r in rows]))


if __name__ == "__main__":
    main()
