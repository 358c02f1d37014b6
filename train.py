"""Train a character-level GPT: python train.py [heads=4] [model=small] [key=value ...]

Hydra composes conf/config.yaml with the command line; microgpt.trainer.train does the work.
"""

import hydra
from omegaconf import DictConfig

from microgpt.cli import register, user_errors
from microgpt.trainer import train

register()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    with user_errors():
        metrics = train(cfg)
    return metrics.get("best_val_loss", float("nan"))  # what a Hydra sweeper would minimise


if __name__ == "__main__":
    main()
