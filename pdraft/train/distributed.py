"""Several processes through `torchrun` (torch.distributed, one process per GPU or CPU slot), nothing
home-made. This file is the one place that says how the world is set up, how data is sharded and how a
checkpoint is written and read at another world size.

**World.** Without WORLD_SIZE (a plain `pdraft train`) everything is one process and these helpers do
nothing. Under torchrun each process joins the group (NCCL on GPUs, Gloo on CPUs; each process uses the GPU
of its LOCAL_RANK, see `pdraft.runtime.resolve_device`) and wraps the drafter in DDP
(`train.distributed: ddp`, the default) or FSDP2 (`fsdp`: `torch.distributed.fsdp.fully_shard` over the
drafter, which runs on CPUs with Gloo too; the legacy FullyShardedDataParallel refuses
CPUs). Only rank 0 prints, logs and writes files.

**Data.** One optimizer step reads a *global batch* of ``batch_size x grad_accum x world_size`` sequences
from one global order (`loop.DataCursor`, a permutation per epoch). The step's sequences are cut into
``grad_accum x world_size`` micro-batch *slots* of ``batch_size``; slot ``s = micro x world_size + rank``
(`micro_slot`) is what process ``rank`` reads at micro-batch ``micro``, and its anchors are drawn from a
generator seeded by the global slot number. So the same global batch gives the same slots, whatever the
mix of processes and accumulation steps: 2 processes x grad_accum 1 read exactly what 1 process x
grad_accum 2 reads, and the averaged gradient is the same mean over slots.

**Checkpoints at any world size.** Everything a checkpoint holds is world-size independent: the drafter as
one full safetensors file (gathered from the FSDP shards), the optimizer state gathered to full tensors and
keyed by parameter name (`torch.distributed.checkpoint.state_dict`, stored as safetensors + JSON, never
pickle), the scheduler step, rank 0's RNG state (the anchors do not use it), the data position counted in
global sequences, and the global batch. A run resumed with another number of processes keeps the global
batch by recomputing grad_accum (`resume_grad_accum`), so it reads the same sequences in the same slots and
takes the same number of steps on the same schedule; only the order in which gradients are summed across
processes changes, so weights agree to float rounding, not bit for bit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pdraft.errors import PdraftError
from pdraft.runtime import env_rank, env_world_size, join_group, leave_group  # noqa: F401  (the group itself)


@dataclass
class World:
    rank: int
    size: int
    device: torch.device
    strategy: str  # "none" | "ddp" | "fsdp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- the model ------------------------------------------------------------------------------------
    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """DDP, or FSDP2 with the whole drafter as one unit. Build the optimizer after this: FSDP2 replaces
        the parameters by sharded DTensors.

        One unit, not one per layer: the drafter projects the context into every layer's keys and values
        before the layers run (`context_kv`, outside the layers' own forward), which a per-layer unit would
        meet still sharded. A drafter is a few layers, so gathering it for the pass costs little; gradients
        and optimizer state, the bulk of training memory, stay sharded."""
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DDP(module, device_ids=ids)
        if self.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(module)
        return module

    def no_sync(self, module, last: bool):
        """Skip the gradient reduction on all but the last micro-batch of a step."""
        if self.strategy == "ddp" and not last:
            return module.no_sync()
        if self.strategy == "fsdp":
            module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Sum floats over processes (statistics for the log); identity in a single process."""
        if self.size <= 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    # ---- checkpoints: full, world-size independent state -----------------------------------------------
    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # cpu_offload gathers to rank 0 only (other ranks get {}); it needs a process group.
        return StateDictOptions(full_state_dict=True, cpu_offload=self.size > 1)

    def full_model_state(self, module) -> dict[str, torch.Tensor]:
        """The drafter's full weights (gathered under FSDP), keyed as `drafter.state_dict()`. Collective:
        every rank calls it; under several processes only rank 0 gets the tensors."""
        if self.strategy != "fsdp":
            inner = module.module if self.strategy == "ddp" else module
            return {k: v.detach() for k, v in inner.drafter.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(module, options=self._options())
        return {k.removeprefix("drafter."): v for k, v in full.items()}

    def full_optimizer_state(self, module, optimizer) -> dict:
        """Optimizer state with full tensors keyed by parameter name (not by position in a process's shard),
        so any world size can load it. Collective, like full_model_state."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(module, optimizer, options=self._options())

    def load_optimizer_state(self, module, optimizer, state: dict) -> None:
        """Load a full, name-keyed optimizer state; under FSDP each rank keeps its shard of it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if all(isinstance(k, int) for k in state.get("state", {})) and state.get("state"):
            # A checkpoint from before name-keyed state: positions are only meaningful unsharded.
            if self.strategy == "fsdp":
                raise PdraftError("this checkpoint's optimizer state predates world-size independent "
                                  "checkpoints and cannot be loaded under FSDP", hint="resume it with ddp")
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def setup(strategy: str, device: torch.device) -> World:
    """The world of this process: rank, size, device and strategy (joining the group if needed)."""
    size = env_world_size()
    if size <= 1:
        return World(rank=0, size=1, device=device, strategy="none")
    if strategy == "none":
        raise PdraftError("train.distributed is 'none' but WORLD_SIZE > 1 (started by torchrun?)",
                          hint="set train.distributed to ddp or fsdp, or start a single process")
    join_group(device)
    return World(rank=dist.get_rank(), size=size, device=device, strategy="ddp" if strategy == "auto" else strategy)


def micro_slot(micro: int, world: World) -> int:
    """The global micro-batch slot process `world.rank` reads at micro-batch `micro` of a step."""
    return micro * world.size + world.rank


def resume_grad_accum(saved_global_batch: int | None, batch_size: int, grad_accum: int, world_size: int,
                      saved_world: int | None) -> int:
    """grad_accum for a resumed run so that its global batch stays the checkpoint's.

    The recipe's own grad_accum is used when it already gives that global batch; otherwise (another number
    of processes) it is recomputed, and a global batch the new world cannot split into whole micro-batches
    of `batch_size` is refused rather than silently changed."""
    if saved_global_batch is None or batch_size * grad_accum * world_size == saved_global_batch:
        return grad_accum
    per = batch_size * world_size
    if saved_global_batch % per:
        raise PdraftError(f"this run was checkpointed with a global batch of {saved_global_batch} sequences "
                          f"({saved_world} process(es)); {world_size} process(es) x train.batch_size {batch_size} "
                          "cannot make it up with whole micro-batches",
                          hint=f"pick a train.batch_size that divides {saved_global_batch // world_size}, "
                               "or another number of processes")
    return saved_global_batch // per
