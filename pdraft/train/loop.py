"""`pdraft train`: train a drafter of any registered family from the hidden-state cache or online, with checkpoints
that survive a kill, exact resume, a progress bar, a JSONL metrics log and periodic validation.

One optimizer step reads ``batch_size x grad_accum x world_size`` sequences in a fixed order (a permutation
per epoch, seeded by the run seed), samples anchors per sequence, runs the drafter's teacher-forced pass
once over all blocks and applies the chunked losses of `pdraft.train.losses`. The data position is counted
in sequences of that global order, so a run resumed with a different number of processes continues where
the last one stopped. Validation reports the acceptance the losses imply (``1 - TV`` per position) and the
accepted length it predicts, ``tau ~ 1 + sum_k prod_{i<=k} (1 - TV_i)``, so a user sees whether training
helps before decoding. A family's own training term (DFlash2: `alpha_selector` x its selector's K-way
cross-entropy) is the drafter's `extra_train_loss`, added to the loss, its metrics logged (as window means)
beside the shared terms; loss weights a recipe leaves null take the family's defaults.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pdraft import ledger
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local
from pdraft.locks import LOCK_NAME
from pdraft.models import load_drafter, save_drafter
from pdraft.models.build import build_from_recipe, start_from_target
from pdraft.models.families import FAMILIES
from pdraft.readback import iter_lines, loads
from pdraft.recipe import dump_resolved
from pdraft import run_folder as ck
from pdraft.paths import fresh_dir
from pdraft.train import distributed as dist_util
from pdraft.train.fresh import clear_run
from pdraft.train.batches import micro_generator, sample_anchors, split_validation, supervised_mask
from pdraft.train.losses import drafter_loss, position_weights
from pdraft.train.schedule import warmup_cosine

log = logging.getLogger("pdraft.train")
METRICS_LOG = ck.METRICS_LOG
FINAL = ck.FINAL


@dataclass
class LossSettings:
    alpha_ce: float
    alpha_tv: float
    alpha_conf: float
    decay: float
    chunk_size: int
    fused: bool = False
    confidence_label: str = "tv"
    family: dict = field(default_factory=dict)  # the family's own loss weights (its train_fields) for its extra term
    alpha_kl: float = 0.0
    products: torch.dtype = torch.float32  # the loss's head products: bf16 under a bf16 CPU runtime (drafter_loss)

    @classmethod
    def from_recipe(cls, train, drafter, products: torch.dtype = torch.float32) -> LossSettings:
        spec = FAMILIES.of(drafter.config)
        has_conf = bool(drafter.config.has_confidence)
        return cls(
            alpha_ce=train.alpha_ce,
            alpha_tv=train.alpha_tv if train.alpha_tv is not None else spec.loss_defaults.get("alpha_tv", 0.0),
            alpha_kl=train.alpha_kl if train.alpha_kl is not None else spec.loss_defaults.get("alpha_kl", 0.0),
            alpha_conf=(train.alpha_conf if train.alpha_conf is not None else 1.0) if has_conf else 0.0,
            decay=train.loss_decay or spec.loss_defaults.get("loss_decay") or float(drafter.train_gamma()),
            chunk_size=train.loss_chunk_size,
            fused=train.fused_loss,
            confidence_label=train.confidence_target,
            family={name: getattr(train, name) for name in spec.train_fields},
            products=products,
        )


@dataclass
class StepStats:
    loss: float = 0.0
    ce: float = 0.0
    tv: float = 0.0
    conf: float = 0.0
    kl: float = 0.0
    tokens: int = 0
    pos_accept: torch.Tensor | None = None  # [G] sums of 1 - TV
    pos_count: torch.Tensor | None = None  # [G]
    tau_sum: float = 0.0
    blocks: int = 0
    greedy_tau_sum: float | None = None  # sum over blocks of 1 + sum_k prod_{i<=k} [argmax agrees]
    extra: dict[str, float] | None = None  # the family's extra term's metrics(), means like `loss`

    def add(self, other: StepStats, weight: float = 1.0) -> None:
        self.loss += other.loss * weight
        self.ce += other.ce * weight
        self.tv += other.tv * weight
        self.conf += other.conf * weight
        self.kl += other.kl * weight
        self.tokens += other.tokens
        self.tau_sum += other.tau_sum
        self.blocks += other.blocks
        if other.greedy_tau_sum is not None:
            self.greedy_tau_sum = (self.greedy_tau_sum or 0.0) + other.greedy_tau_sum
        if other.extra is not None:
            mine = self.extra or dict.fromkeys(other.extra, 0.0)
            self.extra = {k: mine[k] + v * weight for k, v in other.extra.items()}
        self.pos_accept = other.pos_accept if self.pos_accept is None else self.pos_accept + other.pos_accept
        self.pos_count = other.pos_count if self.pos_count is None else self.pos_count + other.pos_count

    def reduced(self, world) -> StepStats:
        """The global step's statistics from every process's share: means over micro-batch slots (each
        process holds the mean of its own), counts and sums added."""
        if world.size <= 1 or self.pos_accept is None:
            return self
        g = len(self.pos_accept)
        sel = sorted(self.extra or {})
        vals = world.sum([self.loss, self.ce, self.tv, self.conf, float(self.tokens), self.tau_sum, float(self.blocks),
                          self.greedy_tau_sum or 0.0, *self.pos_accept.double().tolist(), *self.pos_count.double().tolist(),
                          *(self.extra[k] for k in sel), self.kl])
        kl = vals.pop() / world.size
        w = world.size
        sel_vals = vals[len(vals) - len(sel):] if sel else []
        vals = vals[: len(vals) - len(sel)]
        return StepStats(extra={k: v / w for k, v in zip(sel, sel_vals)} if sel else None, loss=vals[0] / w, ce=vals[1] / w, tv=vals[2] / w, conf=vals[3] / w, tokens=round(vals[4]),
                         tau_sum=vals[5], blocks=round(vals[6]),
                         greedy_tau_sum=None if self.greedy_tau_sum is None else vals[7],
                         pos_accept=torch.tensor(vals[8: 8 + g], dtype=self.pos_accept.dtype),
                         pos_count=torch.tensor(vals[8 + g:], dtype=self.pos_count.dtype), kl=kl)

    def summary(self) -> dict:
        acc = (self.pos_accept / self.pos_count.clamp_min(1)).tolist() if self.pos_accept is not None else []
        return {"loss": self.loss, "ce": self.ce, "tv": self.tv, "conf": self.conf, "kl": self.kl,
                "accept": (float(self.pos_accept.sum() / self.pos_count.sum().clamp_min(1))
                           if self.pos_accept is not None else 0.0),
                "tau_est": self.tau_sum / max(1, self.blocks), "accept_per_position": [round(a, 4) for a in acc],
                "greedy_tau_est": (None if self.greedy_tau_sum is None
                                   else self.greedy_tau_sum / max(1, self.blocks))} | (self.extra or {})


def block_loss(module, batch, anchors, keep, w_lm, settings: LossSettings):
    """Loss and statistics of one micro-batch. `module` is the `TrainForward` of the drafter, or its DDP or
    FSDP wrapper."""
    g = module_drafter(module).train_gamma()
    sup = supervised_mask(anchors, keep, batch.loss_mask, g)  # [b, N, G]
    k = torch.arange(g, device=anchors.device).expand(*sup.shape)
    weights = position_weights(k, settings.decay)
    b, s = batch.input_ids.shape
    t_idx = (anchors[:, :, None] + torch.arange(g, device=anchors.device)).clamp(max=s - 1)  # [b, N, G]
    # The target position each supervised slot reads, as a row of the flattened [b * S, H] last hidden states:
    # overlapping blocks share rows, and the loss computes the target's distribution once per row.
    t_rows = t_idx + torch.arange(b, device=anchors.device)[:, None, None] * s  # [b, N, G]
    t_hidden = batch.last_hidden.reshape(b * s, -1)  # [b * S, H]
    # The family's own term, if it has one, with the same target rows and head the shared losses read.
    extra = dict(valid=sup, weights=weights, target_hidden=t_hidden, target_rows=t_rows, target_head=w_lm,
                 **settings.family)
    out, w2, sel = module(batch.input_ids, batch.features, anchors, compute_logits=False, extra=extra)
    sup = sup & out.label_valid  # a drafter may leave a position unsupervised (EAGLE-3: a chain with no root)
    n = out.hidden.shape[1]
    u = None if out.seq_features is None else out.seq_features[sup]
    conf = None if out.confidence_logits is None else out.confidence_logits[sup]
    res = drafter_loss(out.hidden[sup], w_lm, t_hidden, out.target_ids[sup],
                       weights[sup], t_index=t_rows[sup], u=u,
                       w2=w2, conf_logits=conf, alpha_ce=settings.alpha_ce,
                       alpha_tv=settings.alpha_tv, alpha_conf=settings.alpha_conf, chunk_size=settings.chunk_size,
                       fused=settings.fused, confidence_label=settings.confidence_label, head=out.head, vocab=out.vocab,
                       alpha_kl=settings.alpha_kl, products=settings.products)
    with torch.no_grad():
        acc = torch.zeros(b, n, g, device=sup.device)
        acc[sup] = res.accept.to(acc.dtype)
        blocks = sup[:, :, 0]
        tau = (acc.cumprod(-1) * sup).sum(-1) + 1.0  # [b, N]
        greedy_tau = None
        if res.agree is not None:  # teacher-forced greedy acceptance: the draft's argmax equals the target's
            agree = torch.zeros(b, n, g, device=sup.device)
            agree[sup] = res.agree.to(agree.dtype)
            greedy_tau = float(((agree.cumprod(-1) * sup).sum(-1) + 1.0)[blocks].sum())
        stats = StepStats(loss=float(res.loss), ce=float(res.ce), tv=float(res.tv), conf=float(res.conf),
                          kl=0.0 if res.kl is None else float(res.kl),
                          tokens=int(sup.sum()), pos_accept=acc.sum((0, 1)).cpu(), pos_count=sup.sum((0, 1)).cpu(),
                          tau_sum=float(tau[blocks].sum()), blocks=int(blocks.sum()), greedy_tau_sum=greedy_tau,
                          extra=None if sel is None else sel.metrics())
    loss = res.loss if sel is None else res.loss + sel.loss
    if sel is not None:
        stats.loss = float(loss.detach())
    return loss, stats


def module_drafter(module):
    """The drafter inside a `TrainForward`, or inside its DDP / FSDP wrapper (which keeps it as `.module`)."""
    return (module.module if hasattr(module, "module") else module).drafter


class TrainForward(torch.nn.Module):
    """The module a training step runs (wrapped by DDP or FSDP under torchrun): they only hook `forward`, so it
    routes to the drafter's teacher-forced pass. The sequential head's W2, which the loss multiplies outside the
    drafter, is returned from inside the forward so that FSDP hands out the gathered matrix and its gradient
    reaches the shards; the family's extra term (the drafter's `extra_train_loss`, e.g. DFlash2's selector) is
    computed inside the forward for the same reason (`extra`: the supervised mask, position weights and the
    family's loss weights). Public for scripts that time one step as training runs it (benchmarks/)."""

    def __init__(self, drafter, autocast: torch.dtype | None = None):
        super().__init__()
        self.drafter = drafter
        # bf16 autocast on a CPU with bf16 units (runtime.dtype resolves to bfloat16 there, issue 38): the
        # drafter's products run in bf16 over fp32 master weights, and everything the losses read comes back in
        # fp32 (the losses, the optimizer and the checkpoints stay fp32).
        self.autocast = autocast

    def forward(self, *args, extra: dict | None = None, **kwargs):
        with torch.autocast("cpu", dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            out = self.drafter.forward_train(*args, **kwargs)
        if self.autocast is not None:
            out.hidden = out.hidden.float()
            if out.seq_features is not None:
                out.seq_features = out.seq_features.float()
        term = None if extra is None else self.drafter.extra_train_loss(out, **extra)
        return out, out.seq_w2, term


@dataclass
class TrainReport:
    run_dir: Path
    final_dir: Path
    steps: int
    resumed_from: int | None
    seconds: float
    last: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)


def _order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator()
    g.manual_seed(seed * 7919 + epoch)
    return torch.randperm(n, generator=g).tolist()


class DataCursor:
    """Position in the global, epoch-permuted order of training sequences."""

    def __init__(self, train_ids: list[int], seed: int, epoch: int = 0, index: int = 0):
        self.ids, self.seed, self.epoch, self.index = train_ids, seed, epoch, index
        self._perm = _order(len(train_ids), seed, epoch)

    def take(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.index >= len(self._perm):
                self.epoch, self.index = self.epoch + 1, 0
                self._perm = _order(len(self.ids), self.seed, self.epoch)
            out.append(self.ids[self._perm[self.index]])
            self.index += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


@torch.no_grad()
def validate(module, drafter, source, val_ids, settings, w_lm, batch_size, num_anchors, seed, device,
             dtype) -> dict:
    """Every process validates the whole (small) held-out set through `module`: FSDP needs every rank in
    each forward, and the result is then the same at any world size."""
    if not val_ids:
        return {}
    drafter.eval()
    total = StepStats()
    for i in range(0, len(val_ids), batch_size):
        batch = source.batch(val_ids[i: i + batch_size], device, dtype)
        anchors, keep = sample_anchors(batch.loss_mask.cpu(), num_anchors, micro_generator(seed + 1, i))
        _, stats = block_loss(module, batch, anchors.to(device), keep.to(device), w_lm, settings)
        total.add(stats, 1.0 / math.ceil(len(val_ids) / batch_size))
    drafter.train()
    return total.summary()


def _init_from(drafter, folder: Path, target) -> None:
    """drafter.init_from: start from the weights of the saved drafter in `folder` (a Hub id is pulled into a
    folder before training starts: init_from_folder), which must fit the target and have the architecture the
    recipe's drafter section describes."""
    mine = drafter.state_dict()
    theirs = load_drafter(folder, target.config, device=next(iter(mine.values())).device).state_dict()
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        raise PdraftError(f"drafter.init_from {folder}: its weights do not match the recipe's drafter section "
                          "(another kind or size)", hint="make the drafter section describe that checkpoint")
    drafter.load_state_dict(theirs)


def init_from_folder(recipe, init_from: str | Path | None = None) -> Path | None:
    """The folder drafter.init_from names: `init_from` where the command resolved it (a Hub id pulled by
    pdraft.hub.pull.drafter_folder), else the recipe's value, which must then be a folder."""
    if init_from is not None:
        return Path(init_from)
    if not recipe.drafter.init_from:
        return None
    path = Path(recipe.drafter.init_from).expanduser()
    if not path.is_dir():
        raise PdraftError(f"drafter.init_from {recipe.drafter.init_from} is not a folder: a Hub id is pulled before "
                          "training (`pdraft train` does it; from Python pass "
                          "init_from=pdraft.hub.pull.drafter_folder(id))")
    return path


def train(recipe, target, source, *, run_dir: str | Path, fresh: bool = False, progress=None,
          stop_after: int | None = None, init_from: str | Path | None = None) -> TrainReport:
    """Train (or resume) the recipe's drafter for `target` on `source` (CacheSource or OnlineSource).
    `stop_after` ends the call after that many steps of this call (tests use it to simulate a stop);
    `init_from`: the folder drafter.init_from was resolved to (init_from_folder).
    The run folder is locked for the whole call (by the main process of a distributed job only)."""
    from pdraft.locks import folder_lock

    check_train_io(recipe, run_dir, fresh)
    if dist_util.env_rank() != 0:  # torchrun's other ranks (a validated RANK): rank 0 holds the lock for the job
        return _train(recipe, target, source, run_dir=run_dir, fresh=fresh, progress=progress, stop_after=stop_after,
                      init_from=init_from)
    with folder_lock(run_dir, "run folder"):
        return _train(recipe, target, source, run_dir=run_dir, fresh=fresh, progress=progress, stop_after=stop_after,
                      init_from=init_from)


def _train(recipe, target, source, *, run_dir: str | Path, fresh: bool = False, progress=None,
           stop_after: int | None = None, init_from: str | Path | None = None) -> TrainReport:
    # ---- setup: the world, the drafter (the latest checkpoint's, else fresh or drafter.init_from), the optimizer
    tr, rt = recipe.train, target.runtime
    run_dir = Path(run_dir)
    world = dist_util.setup(recipe.train.distributed, rt.device, recipe.target.tensor_parallel, rt.dist_timeout_s)
    if fresh:
        clear_run(run_dir, world)  # only what pdraft wrote; refuses a folder holding anything else
    device, dtype = world.device, rt.dtype
    latest = ck.latest_checkpoint(run_dir)
    final = run_dir / FINAL
    had_final = (final / "config.json").exists()
    drafter = _start_drafter(recipe, target, latest, run_dir, device, init_from)
    drafter.attach_target(target.model)
    train_ids, val_ids = split_validation(len(source))
    if not train_ids:
        raise PdraftError("the training data holds too few sequences to train on")
    if latest is None and not recipe.drafter.init_from and drafter.needs_token_counts:
        drafter.init_from_tokens(source.token_counts(train_ids, int(drafter.config.vocab_size)))
    drafter.train()
    w_lm = target.lm_head_weight()  # whole on every process, also when the target is sharded
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16
    settings = LossSettings.from_recipe(tr, drafter, products=torch.bfloat16 if cpu_bf16 else torch.float32)
    # before the optimizer: FSDP swaps in sharded parameters
    module = world.wrap(TrainForward(drafter, autocast=torch.bfloat16 if cpu_bf16 else None))
    params, opt, sched = _optimizer(module, tr)
    if step_of(latest) < tr.steps:  # this call ends by replacing final/: refuse now, not after training
        ck.check_replaceable(final)

    # ---- resume: optimizer, scheduler, RNG, data position and metrics log as the latest checkpoint left them
    step, cursor, grad_accum, resumed_from = 0, DataCursor(train_ids, rt.seed), tr.grad_accum, None
    if latest is not None:
        step, cursor, grad_accum = _resume(latest, world, module, opt, sched, train_ids, tr, rt.seed, run_dir)
        resumed_from = step
    recipe_yaml = dump_resolved(recipe, {"target.layer_ids": list(target.layer_ids),
                                         "drafter.mask_token_id": getattr(drafter.config, "mask_token_id", None)})

    def write_model(weights: dict):
        return lambda folder: save_drafter(drafter, folder, recipe_yaml=recipe_yaml, state_dict=weights)

    # ---- the loop
    per_step = tr.batch_size * grad_accum * world.size  # the global batch, in sequences
    log_path = run_dir / METRICS_LOG
    start, window, val = time.perf_counter(), StepStats(), {}
    steps_this_call = 0
    while step < tr.steps:
        if stop_after is not None and steps_this_call >= stop_after:
            break
        # step: one global batch, in the same order on every process, over grad_accum micro-batches
        step_stats = _accumulate(module, source, cursor.take(per_step), step, grad_accum, world, tr, rt.seed,
                                 device, dtype, w_lm, settings)
        if tr.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, tr.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        steps_this_call += 1
        step_stats = step_stats.reduced(world)
        window.add(step_stats, 1.0)
        # log
        elapsed = time.perf_counter() - start
        if step % tr.log_every == 0 or step == tr.steps:
            n = max(1, min(tr.log_every, steps_this_call))
            row = {"step": step, "lr": sched.get_last_lr()[0], "tokens_per_s": window.tokens / max(elapsed, 1e-9),
                   **{k: (v / n if k in ("loss", "ce", "tv", "conf", "kl", *(window.extra or {})) else v)
                      for k, v in window.summary().items()}}
            if world.is_main:
                _append_jsonl(log_path, row)
            window, start = StepStats(), time.perf_counter()
        # evaluate
        if step % tr.eval_every == 0 or step == tr.steps:
            val = validate(module, drafter, source, val_ids, settings, w_lm, tr.batch_size, tr.num_anchors, rt.seed,
                           device, dtype)
            if world.is_main and val:
                _append_jsonl(log_path, {"step": step, "validation": val})
        # checkpoint
        if step % tr.checkpoint_every == 0 or step == tr.steps:
            weights = world.full_model_state(module)  # collective under FSDP
            opt_state = world.full_optimizer_state(module, opt)
            if world.is_main:
                ck.save_checkpoint(run_dir, step, write_model(weights), opt_state, sched,
                                   {"data": cursor.state(), "world_size": world.size, "global_batch": per_step,
                                    "grad_accum": grad_accum}, keep=tr.keep_checkpoints)
            world.barrier()
        if progress is not None:
            progress(step, tr.steps, step_stats.summary() | {"loss": step_stats.loss})

    # ---- final/: a finished run that is merely re-invoked keeps its final folder (and what was written beside
    # the drafter since, such as the calibration)
    if step >= tr.steps and (steps_this_call > 0 or not had_final):
        weights = world.full_model_state(module)
        if world.is_main:
            tmp = fresh_dir(run_dir / f".tmp_{FINAL}")
            write_model(weights)(tmp)
            ck.install_dir(tmp, final)  # replaces an older final only if pdraft wrote it
    world.barrier()
    return TrainReport(run_dir=run_dir, final_dir=final, steps=step, resumed_from=resumed_from,
                       seconds=time.perf_counter() - start, validation=val)


def _optimizer(module, tr):
    """(trained parameters, AdamW, warmup-cosine schedule) of the recipe's train section."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tr.lr, betas=(0.9, 0.95), weight_decay=tr.weight_decay)
    warmup = int(tr.warmup_ratio * tr.steps) if tr.warmup_ratio is not None else tr.warmup_steps
    return params, opt, warmup_cosine(opt, tr.steps, warmup, tr.min_lr_ratio)


def _start_drafter(recipe, target, latest: Path | None, run_dir: Path, device, init_from: str | Path | None):
    """The drafter a run starts from: the latest checkpoint's (of the recipe's kind), else a fresh one from the
    recipe's drafter section, with drafter.init_from's weights when it names a drafter."""
    if latest is not None:
        drafter = load_drafter(latest, target.config, device=device)
        if drafter.config.kind != recipe.drafter.kind:
            raise PdraftError(f"{run_dir} holds a {drafter.config.kind} run but the recipe asks for "
                              f"{recipe.drafter.kind}", hint="use another train.output_dir or --fresh")
        return drafter
    drafter = build_from_recipe(recipe.drafter, target, seed=target.runtime.seed).to(device)
    folder = init_from_folder(recipe, init_from)
    if folder is not None:
        _init_from(drafter, folder, target)
    elif recipe.drafter.init_from_target:
        copied = start_from_target(drafter, target.model)
        if copied:
            log.info("started %d drafter parameters from the target's top layers and final norm", len(copied))
        else:  # the quickstart applies the recipe to every family: one without a counterpart starts random
            log.warning("drafter.init_from_target: no %s parameter matches a target layer by name and shape; it "
                        "starts from random weights", recipe.drafter.kind)
    return drafter


def _resume(latest: Path, world, module, opt, sched, train_ids, tr, seed: int, run_dir: Path):
    """(step, data cursor, grad_accum) of the checkpoint `latest`, with the optimizer, scheduler and RNG states
    restored and the metrics log cut back to its step."""
    state, opt_state = ck.read_trainer_state(latest)
    if state.get("data") is None:  # exact resume needs the data position; never restart it silently
        raise PdraftError(f"checkpoint {latest} holds no data position (it is not a drafter training's)",
                          hint="rerun with --fresh")
    world.load_optimizer_state(module, opt, opt_state)
    if state.get("scheduler") is not None:
        sched.load_state_dict(state["scheduler"])
    ck.set_rng_state(state["rng"])
    step = int(state["step"])
    cursor = DataCursor(train_ids, seed, **state["data"])
    grad_accum = dist_util.resume_grad_accum(state.get("global_batch"), tr.batch_size, tr.grad_accum,
                                             world.size, state.get("world_size"))
    if world.is_main:
        _truncate_log(run_dir / METRICS_LOG, step)  # rows a killed run wrote after its last checkpoint
    return step, cursor, grad_accum


def _accumulate(module, source, ids: list[int], step: int, grad_accum: int, world, tr, seed: int, device, dtype,
                w_lm, settings) -> StepStats:
    """Forward and backward of one optimizer step's micro-batches (this process's slots of the global batch
    `ids`), gradients accumulated; the step's figures."""
    step_stats = StepStats()
    for micro in range(grad_accum):
        slot = dist_util.micro_slot(micro, world)
        batch = source.batch(ids[slot * tr.batch_size: (slot + 1) * tr.batch_size], device, dtype)
        gen = micro_generator(seed, step * grad_accum * world.size + slot)
        anchors, keep = sample_anchors(batch.loss_mask.cpu(), tr.num_anchors, gen)
        with world.no_sync(module, last=micro == grad_accum - 1):
            loss, stats = block_loss(module, batch, anchors.to(device), keep.to(device), w_lm, settings)
            (loss / grad_accum).backward()
        step_stats.add(stats, 1.0 / grad_accum)
    return step_stats


def step_of(checkpoint: Path | None) -> int:
    """The step a checkpoint folder holds (0 for none), from its name."""
    return 0 if checkpoint is None else int(checkpoint.name.removeprefix("step_"))


def io_plan(recipe, run_dir: str | Path, fresh: bool = False) -> tuple[list[Input], list[Output]]:
    """What `train` reads (the recipe, the cache's manifest and shards or the online data, drafter.init_from,
    a local target) and writes or deletes in the run folder (its lock, `latest`, the metrics log, final/ and
    every checkpoint folder, which pruning and --fresh delete): see pdraft.io_plan."""
    from pdraft.cache.export_hidden import cache_folder
    from pdraft.cache.format import MANIFEST_NAME

    run_dir = Path(run_dir)
    inputs = input_if_local("the recipe", recipe.source) + input_if_local("target.id", recipe.target.id)
    inputs += input_if_local("drafter.init_from", recipe.drafter.init_from)
    if recipe.train.online:
        inputs += input_if_local("data.source", recipe.data.source)
    else:  # file by file: a cache may share the run folder (train.output_dir = output_dir = data.cache_dir)
        cache = cache_folder(recipe)
        inputs += [Input("the hidden-state cache", p) for p in
                   [cache / MANIFEST_NAME, *sorted(cache.glob("shard-*.safetensors"))] if os.path.lexists(p)]
    outputs = [Output("train.output_dir", run_dir, "folder", artifact="run folder", shares=("hidden-state cache",),
                      whole=False),
               Output("its lock", run_dir / LOCK_NAME, "append"), Output("its latest", run_dir / ck.LATEST),
               Output("its metrics log", run_dir / METRICS_LOG, "append"), Output("its final/", run_dir / FINAL, "folder")]
    if run_dir.is_dir():
        outputs += [Output(f"its {e.name}/", e, "folder") for e in sorted(run_dir.iterdir())
                    if ck._STEP.match(e.name) or ck._TMP.match(e.name)]
    return inputs, outputs


def check_train_io(recipe, run_dir: str | Path, fresh: bool = False) -> None:
    """Refuse, before anything is loaded or written, a run folder over train's inputs (pdraft.io_plan)."""
    check_io("train", *io_plan(recipe, run_dir, fresh))


def run_dir_of(recipe) -> Path:
    """The run folder of a recipe: train.output_dir, else OUTPUT_DIR/<drafter kind>."""
    return Path(recipe.train.output_dir) if recipe.train.output_dir else Path(recipe.output_dir) / recipe.drafter.kind


def training_source(recipe, target, console=None, *, loop_for=None):
    """The cache written by export-hidden, or the tokenised data for online training. Online, the data comes
    from the data-preparation stage export-hidden runs too (pdraft.data.prepare): with data.regenerate the
    responses are the target's own, those export-hidden regenerated into the cache folder, made (or finished)
    here first when they are not all there, by data.regenerate_engine (`loop_for`: transformers' batch
    generator, handed in by the command). `target` may be a TargetInfo: an online source loads the weights after
    any vLLM regeneration (`source.target`)."""
    from pdraft.cache.export_hidden import cache_folder, progress_bar
    from pdraft.cache.reader import HiddenCache
    from pdraft.data.prepare import load_records, loaded, prepare_sequences
    from pdraft.train.batches import CacheSource, OnlineSource

    if recipe.train.online:
        prepared = prepare_sequences(recipe, target, list(load_records(recipe)), cache_folder(recipe),
                                     bar=functools.partial(progress_bar, console), loop_for=loop_for)
        return OnlineSource(loaded(recipe, prepared.target), prepared.sequences)
    return CacheSource(HiddenCache(cache_folder(recipe), target=target))


MAX_LOG_LINE = 1 << 20  # a metrics row is a few hundred bytes


def _truncate_log(path: Path, step: int) -> None:
    """Keep the metrics log's rows up to `step` (a killed run wrote the later ones after its last checkpoint),
    streamed line by line within a bound, never read whole: the log of a long run may hold gigabytes."""
    if not path.exists():
        return

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as out:
            for line in iter_lines(path, "metrics log", MAX_LOG_LINE, inside="run folder"):
                if line.strip() and len(line) <= MAX_LOG_LINE and _row_step(line) <= step:
                    out.write(line.rstrip(b"\n") + b"\n")

    ledger.write_with(path, write)


def _row_step(line: bytes) -> int:
    try:
        row = loads(line)
        return int(row.get("step", 0))
    except (ValueError, AttributeError, TypeError, OverflowError):
        return 1 << 62  # a torn last line from a kill: drop it


def _append_jsonl(path: Path, row: dict) -> None:
    ledger.append_log(path, json.dumps(row) + "\n", what="metrics log")
