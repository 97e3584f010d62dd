"""Several processes through `torchrun` (torch.distributed, one process per GPU), nothing home-made.

Without WORLD_SIZE (a plain `pdraft train`) everything is a single process and these helpers do nothing.
Under torchrun each process joins the group (NCCL on GPUs, Gloo on CPUs), takes its own slice of every
optimizer step's sequences, and wraps the drafter in DDP (`train.distributed: ddp`, the default) or FSDP
(`fsdp`, for drafters too large to replicate). Only rank 0 writes checkpoints and logs.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pdraft.errors import PdraftError


@dataclass
class World:
    rank: int
    size: int
    device: torch.device
    strategy: str  # "none" | "ddp" | "fsdp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DDP(module, device_ids=ids)
        if self.strategy == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            return FSDP(module, device_id=self.device if self.device.type == "cuda" else None)
        return module

    def no_sync(self, module, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.strategy in ("ddp", "fsdp") and not last:
            return module.no_sync()
        return contextlib.nullcontext()

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def setup(strategy: str, device: torch.device) -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(rank=0, size=1, device=device, strategy="none")
    if strategy == "none":
        raise PdraftError("train.distributed is 'none' but WORLD_SIZE > 1 (started by torchrun?)")
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(rank=rank, size=size, device=device, strategy="ddp" if strategy == "auto" else strategy)
