"""Sample from a trained model: python sample.py [num_samples=20] [temperature=0.8] [prefix=...]

Names from a names run; from a text run (data.format=text), passages that continue `prefix`.

With no ckpt= or run=, it samples from the best checkpoint of the most recent run under outputs/
or multirun/. Hydra composes conf/sample.yaml with the command line (and writes no output
folder); microgpt.commands.sample.sample_from_config does the work and this prints what it returns.
"""

import math
import sys
import time
from pathlib import Path

from microgpt import entry

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    import hydra
    from omegaconf import DictConfig

    from microgpt import cli
    from microgpt.commands.sample import sample_from_config

cli.register()


class Progress:
    """`microgpt: sampled 3,000 of 10,000 (30%)` on stderr, at most once a second and at the end,
    for work that takes more than one step."""

    def __init__(self, what: str, every: float = 1.0):
        self.what, self.every, self.last, self.calls = what, every, -math.inf, 0

    def __call__(self, done: int, total: int) -> None:
        self.calls += 1
        now = time.monotonic()
        if (done >= total and self.calls == 1) or (done < total and now - self.last < self.every):
            return  # done in one step, or shown less than a second ago
        self.last = now
        print(f"microgpt: {self.what} {done:,} of {total:,} ({100 * done // total}%)",
              file=sys.stderr, flush=True)  # fmt: skip


@hydra.main(version_base=None, config_path="conf", config_name="sample")
def main(cfg: DictConfig) -> None:
    with cli.user_errors():
        result = sample_from_config(cfg, progress=Progress("sampled"))
    if result.stdout is not None:  # out=-: the items alone on standard output, the report on stderr
        print("\n".join(result.lines), file=sys.stderr, flush=True)
        print("\n".join(result.stdout), flush=True)
    else:
        print("\n".join(result.lines), flush=True)


if __name__ == "__main__":
    cli.main(main, Path(__file__).parent / "conf", "sample")
