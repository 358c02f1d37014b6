"""Train a character-level GPT: python train.py [heads=4] [model=small] [key=value ...]

Hydra composes conf/config.yaml with the command line; microgpt.train.trainer.train does the work.
microgpt.cli checks every setting first (every job of a -m sweep), so a bad one stops the command
in one line before any folder is made. `resume=true|RUN_FOLDER|CHECKPOINT` takes the run's own
settings from its checkpoint.
"""

from pathlib import Path

from microgpt import entry

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    import hydra
    from omegaconf import DictConfig

    from microgpt import cli
    from microgpt.train.trainer import train

cli.register()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    with cli.user_errors():
        metrics = train(cli.resume_settings(cfg))
    return metrics.get("best_val_loss", float("nan"))  # what a Hydra sweeper would minimise


if __name__ == "__main__":
    cli.main(main, Path(__file__).parent / "conf", "config")
