"""Several processes through `torchrun` (torch.distributed, one process per GPU or CPU slot), nothing
home-made. This file is the one place that says how the world is set up, how data is sharded and how a
checkpoint is written and read at another world size.

**World.** Without WORLD_SIZE (a plain `pdraft train`) everything is one process and these helpers do
nothing. Under torchrun each process joins the group (NCCL on GPUs, Gloo on CPUs; each process uses the GPU
of its LOCAL_RANK, see `pdraft.runtime.resolve_device`) and wraps the drafter in DDP
(`train.distributed: ddp`, the default) or FSDP2 (`fsdp`: `torch.distributed.fsdp.fully_shard` over the
drafter, which runs on CPUs with Gloo too; the legacy FullyShardedDataParallel refuses
CPUs). Only rank 0 prints, logs and writes files.

**A sharded target** (`target.tensor_parallel: N`, pdraft.runtime.Layout). The N processes of a
tensor-parallel group hold one copy of the target between them and must run it in lockstep, so they read the
same micro-batches: the data is split over the *data-parallel* groups only (rank and size below are the
data-parallel ones), and the drafter is wrapped in DDP or FSDP2 over the data-parallel group of its
tensor-parallel position. Each process of a tensor-parallel group keeps a whole replica of the drafter; the
replicas see bit-identical inputs (the target's sharded layers all-reduce their outputs, so every member
gets the same tensors), take the same steps and stay equal without a collective of their own. With one
data-parallel group (N = WORLD_SIZE) the drafter is not wrapped at all.

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
from pdraft.runtime import (env_rank, env_world_size, join_group, layout, leave_group,  # noqa: F401  (the group)
                            wait_for_peers)


@dataclass
class World:
    """This process in the training job. `rank` and `size` are data-parallel: which slice of every global
    batch it reads and over how many replicas gradients are averaged; `global_rank` says who writes."""

    rank: int
    size: int
    device: torch.device
    strategy: str  # "none" | "ddp" | "fsdp"
    global_rank: int = 0
    world_size: int = 1
    tensor_parallel: int = 1
    group: object = None  # the data-parallel process group (None: every process)
    mesh: object = None  # the same group as a 1-D device mesh, for FSDP2 (None: every process)

    @property
    def is_main(self) -> bool:
        return self.global_rank == 0

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
            return DDP(module, device_ids=ids, process_group=self.group)
        if self.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(module, mesh=self.mesh)
        return module

    def no_sync(self, module, last: bool):
        """Skip the gradient reduction on all but the last micro-batch of a step."""
        if self.strategy == "ddp" and not last:
            return module.no_sync()
        if self.strategy == "fsdp":
            module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def barrier(self, what: str = "writing the checkpoint") -> None:
        """Wait for every process (rank 0 writing a checkpoint), saying whom it waits for; see wait_for_peers."""
        if self.world_size > 1:
            wait_for_peers(what)

    def sum(self, values: list[float]) -> list[float]:
        """Sum floats over the data-parallel replicas (statistics for the log); identity with one replica."""
        if self.size <= 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    # ---- checkpoints: full, world-size independent state -----------------------------------------------
    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # cpu_offload gathers to (global) rank 0 only, other ranks get {}; it needs a process group.
        return StateDictOptions(full_state_dict=True, cpu_offload=self.world_size > 1)

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


def setup(strategy: str, device: torch.device, tensor_parallel: int = 1, timeout_s: float | None = None) -> World:
    """The world of this process: its data-parallel rank and size, device and strategy (joining the group if
    needed; `tensor_parallel` is target.tensor_parallel, see the module docstring)."""
    lay = layout(tensor_parallel)
    if lay.world_size <= 1:
        return World(rank=0, size=1, device=device, strategy="none")
    if strategy == "none" and lay.dp_size > 1:
        raise PdraftError("train.distributed is 'none' but WORLD_SIZE > 1 (started by torchrun?)",
                          hint="set train.distributed to ddp or fsdp, or start a single process")
    join_group(device, timeout_s)
    group = mesh = None
    if lay.tensor_parallel > 1:
        from torch.distributed.device_mesh import init_device_mesh

        # Collective: every process builds every group, in the same order (transformers' mesh order).
        mesh = init_device_mesh(device.type, (lay.dp_size, lay.tensor_parallel), mesh_dim_names=("dp", "tp"))["dp"]
        group = mesh.get_group()
    strategy = "none" if lay.dp_size == 1 else ("ddp" if strategy == "auto" else strategy)
    return World(rank=lay.dp_rank, size=lay.dp_size, device=device, strategy=strategy, global_rank=lay.rank,
                 world_size=lay.world_size, tensor_parallel=lay.tensor_parallel, group=group, mesh=mesh)


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
