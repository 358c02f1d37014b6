"""What train.py and sample.py share: the Hydra registrations and the one place user errors are printed."""

from __future__ import annotations

import contextlib
import sys

from omegaconf import OmegaConf


def register() -> None:
    """The config schemas (train, sample) and the resolvers, before @hydra.main composes anything."""
    from microgpt.config import register_configs
    from microgpt.runs import job_dir, output_subdir, record_swept_keys, run_dir
    from microgpt.sampling import register_configs as register_sample_configs

    register_configs()
    register_sample_configs()
    record_swept_keys(sys.argv[1:])
    if not OmegaConf.has_resolver("microgpt_run_dir"):
        OmegaConf.register_new_resolver("microgpt_run_dir", run_dir)
    if not OmegaConf.has_resolver("microgpt_output_subdir"):
        OmegaConf.register_new_resolver("microgpt_output_subdir", output_subdir)
    if not OmegaConf.has_resolver("microgpt_job_dir"):
        OmegaConf.register_new_resolver("microgpt_job_dir", job_dir)
    quiet_other_ranks(sys.argv)


# Under torchrun every rank runs @hydra.main in the one run folder. Ranks other than 0 write
# nothing there: no .hydra/ copy of the config, no train.log (console only, warnings and errors).
OTHER_RANK_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=stdout", "hydra.job_logging.root.level=WARNING")


def quiet_other_ranks(argv: list[str]) -> None:
    """Add OTHER_RANK_OVERRIDES to a torchrun worker's command line when its RANK is not 0."""
    import os

    if "LOCAL_WORLD_SIZE" not in os.environ or os.environ.get("RANK", "0") == "0":
        return
    taken = {a.split("=", 1)[0] for a in argv[1:]}
    argv += [o for o in OTHER_RANK_OVERRIDES if o.split("=", 1)[0] not in taken]


@contextlib.contextmanager
def user_errors():
    """Bad settings, data or checkpoints end the program with a one-line message, not a traceback."""
    from microgpt.checkpoint import CheckpointError
    from microgpt.config import ConfigError
    from microgpt.data import DataError
    from microgpt.sampling import SamplingError
    from microgpt.trainer import Interrupted, TrainingError

    try:
        yield
    except Interrupted as e:
        print(f"microgpt: {e}\nmicrogpt: resume with: {resume_command(e.checkpoint)}", file=sys.stderr)
        sys.exit(130)
    except (ConfigError, DataError, CheckpointError, SamplingError, TrainingError) as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("microgpt: interrupted; checkpoints already written are intact", file=sys.stderr)
        sys.exit(130)


def resume_command(checkpoint) -> str:
    """This program's command line with resume=<checkpoint> in place of any resume=...: the same settings."""
    import shlex
    from pathlib import Path

    args = [a for a in sys.argv[1:] if not a.lstrip("+~").startswith("resume=")]
    return shlex.join(["python", Path(sys.argv[0]).name, *args, f"resume={checkpoint}"])
