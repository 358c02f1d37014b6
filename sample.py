"""Sample from a trained model: python sample.py [num_samples=20] [temperature=0.8] [prefix=...]

Names from a names run; from a text run (data.format=text), passages that continue `prefix`.

With no ckpt= or run=, it samples from the best checkpoint of the most recent run under outputs/
or multirun/. Hydra composes conf/sample.yaml with the command line (and writes no output
folder); microgpt.sample.command.sample_from_config does the work and this prints what it returns.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from microgpt import cli
from microgpt.sample.command import sample_from_config

cli.register()


@hydra.main(version_base=None, config_path="conf", config_name="sample")
def main(cfg: DictConfig) -> None:
    with cli.user_errors():
        result = sample_from_config(cfg, progress=cli.Progress("sampled"))
    if result.to_stdout:  # out=-: the items alone on standard output, the report on stderr
        print("\n".join(result.lines), file=sys.stderr, flush=True)
        print("\n".join(result.names), flush=True)
    else:
        print("\n".join(result.lines), flush=True)


if __name__ == "__main__":
    cli.main(main, Path(__file__).parent / "conf", "sample")
