"""Data-parallel training under torchrun: who am I, and the one process group.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK for each process. Without them this is a single
process (rank 0 of 1) and nothing is initialised.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes logs, TensorBoard, checkpoints and samples."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info_from_env() -> DistInfo:
    return DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def setup(device_type: str) -> DistInfo:
    """Join the process group when started by torchrun: NCCL on GPUs, gloo on CPU."""
    info = dist_info_from_env()
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10))
    return info


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank if `flag` is true on any rank (a stop request must stop them all at once)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
