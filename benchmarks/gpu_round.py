"""The cost of one speculative round on a GPU, piece by piece, for Qwen3-4B and Qwen3-8B sized targets with
random weights (timing does not depend on weight values; nothing is downloaded) and the DFlash / DSpark drafters
DeepSpec pairs with them (5 layers, block 16 and block 7). CUDA events, medians over repeats:

- target step time T_step (one token with a KV cache of --context tokens) and verify time for 1..16 tokens,
  (pdraft.decode.target_runner, what decode runs);
- draft time for gamma = 4, 8, 12, 16 (and 4, 7 for block 7): DFlash, DSpark with the eager sequential-head loop
  and DSpark with the fused Triton kernel (pdraft.models.dspark.fused_seq_head);
- the sequential head's share of a round: DSpark's sample_block minus DFlash's (same LM head and sampling), over
  T_draft + T_verify(gamma + 1);
- DFlash2 of the same size (z-lab block = anchor + gamma masks, conv taps 2, selector top-16, rank 256): its draft
  time at gamma 16 against DFlash's, and the selector's share of a round (DFlash2's sample_block, i.e. top-K plus
  edge scores plus the walk, minus DFlash's sample_block, over T_draft + T_verify(17); issue 17 asks <= 5%);
- host overhead per round: wall time of the engine's own rounds (generate's RoundRecord.round_s: propose,
  verify, acceptance, commit, extend_context) minus the GPU time of its draft and verify passes;
- the training loss (CE + TV + confidence, forward + backward) at the target's vocabulary: chunked torch path vs
  the fused Triton kernels (pdraft.kernels.loss);
- the implied speedup tau * T_step / (T_draft + T_verify(gamma + 1)) for the tau values of --tau or of a bench
  report (--bench-json), else 2, 3, 4, 5, 6.

    python benchmarks/gpu_round.py --device cuda --out gpu_round.json          # one H200: a few minutes
    python benchmarks/gpu_round.py --device cpu --tiny --out /tmp/dry.json     # CPU dry run (CI), < 1 minute
    torchrun --nproc_per_node 1 benchmarks/gpu_round.py --train-ddp --configs qwen3-4b --out gpu_train.json
                                    # bf16 DDP training tokens/s and peak memory (NOT YET RUN on a GPU)

It prints a short table last and writes the full JSON to --out. On the CPU dry run the times are wall-clock
(perf_counter), the fused kernel is skipped (it needs CUDA), and no figure means anything
about a GPU: it only proves that every code path runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

# Real Qwen3 sizes (config.json of Qwen/Qwen3-4B and Qwen/Qwen3-8B); "tiny" is for the CPU dry run.
CONFIGS = {
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
}
COMMON = dict(max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
DEFAULT_TAUS = [2.0, 3.0, 4.0, 5.0, 6.0]


class Timer:
    """Median time of fn() in seconds: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device, repeats: int, warmup: int):
        self.cuda, self.repeats, self.warmup = device.type == "cuda", repeats, warmup

    def __call__(self, fn) -> float:
        times = []
        for i in range(self.warmup + self.repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1000.0
            else:
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
            if i >= self.warmup:
                times.append(dt)
        return statistics.median(times)


def build_target(name: str, device, dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**CONFIGS[name], **COMMON)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: an 8B CPU init alone would take minutes
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval()


def build_drafters(target, block: int, device, dtype):
    from pdraft.models import build_drafter

    cfg = target.config
    out = {}
    for kind in ("dflash", "dspark", "dflash2"):
        # z-lab's block holds the anchor too: block + 1 slots draft the same `block` tokens as DeepSpec's block
        size = block + 1 if kind == "dflash2" else block
        with torch.device(device):
            d = build_drafter(kind, cfg, seed=0, mask_token_id=cfg.vocab_size - 1, num_hidden_layers=5,
                              block_size=size)
        d = d.to(dtype).eval()
        d.attach_target(target)
        out[kind] = d
    return out


def context_state(drafter, batch, context, device, dtype, capacity):
    """A draft state holding `context` committed tokens of random target features, preallocated for
    `capacity` positions so that the timed passes never regrow it."""
    cfg = drafter.config
    state = drafter.new_state(batch, context + capacity)
    feats = torch.randn(batch, context, len(cfg.target_layer_ids) * cfg.hidden_size, device=device, dtype=dtype)
    pos = torch.arange(context, device=device).expand(batch, context)
    drafter.extend_context(state, feats, pos)
    return state


def bench_target(model, args, timer, device, out: dict | None = None, saved=None) -> dict:
    """Verify times for 1..max_verify tokens on every backend of --backends (pdraft.decode.backend: off = the
    reference runner, auto = static caches, on = compiled; on CUDA, CUDA graphs), packed as the engine runs it
    by default. `eager_s` is the reference; `backends[mode]` every backend; compilation happens in the warm-up.
    `out` is filled as it goes and `saved()` called after each backend, so a run cut off while compiling one
    backend keeps the others' figures."""
    from pdraft.decode import backend as backends

    cfg = model.config
    b, ctx = args.batch, args.context
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size - 1, (b, ctx + 1), generator=g).tolist()
    out = {} if out is None else out
    out.update({"eager_s": {}, "backends": {}, "compile_s": {}})
    with torch.no_grad():
        for mode in args.backends:
            before = backends.compile_clock()
            runner = backends.target_runner(model, None, backends.resolve(mode, model), room=args.max_verify + 1)
            runner.prefill(prompts)
            anchors = torch.tensor([p[-1] for p in prompts], device=device)
            apos = torch.full((b,), ctx, device=device)
            times = out["backends"][mode] = {}
            for q in range(1, args.max_verify + 1):
                drafts = torch.randint(0, cfg.vocab_size - 1, (b, q - 1), generator=g).to(device)
                lengths = torch.full((b,), q - 1, device=device)
                discard = torch.full((b,), -1, device=device)

                def step():
                    runner.verify(anchors, apos, drafts, lengths)
                    runner.commit(discard)  # keep nothing: the context stays at `ctx` tokens

                times[q] = timer(step)
            out["compile_s"][mode] = backends.compile_clock() - before
            out["eager_s"] = out["backends"].get("off") or next(iter(out["backends"].values()))
            del runner
            if saved is not None:
                saved()
    out["eager_s"] = out["backends"].get("off") or next(iter(out["backends"].values()))
    return out


def bench_drafters(drafters, args, timer, device, dtype, fused_ok: bool, gammas, model=None) -> dict:
    from pdraft.decode import backend as backends
    from pdraft.models.api import SamplingParams

    compiled = None
    if "on" in args.backends and model is not None:
        on = backends.resolve("on", model)
        compiled = {kind: backends.drafter_pass(d, on) for kind, d in drafters.items()}

    b, ctx = args.batch, args.context
    cap = ctx + 64
    samplings = {"greedy": None, "t1": SamplingParams(temperature=1.0)}
    anchors = torch.zeros(b, dtype=torch.long, device=device)
    apos = torch.full((b,), ctx, device=device)
    rows = []
    with torch.no_grad():
        for kind, d in drafters.items():
            state = context_state(d, b, ctx, device, dtype, cap)
            variants = [("eager", False)] + ([("fused", True)] if kind == "dspark" and fused_ok else [])
            for variant, fused in variants:
                if kind == "dspark":
                    d.use_fused_kernel = fused
                for sname, sp in samplings.items():
                    for gamma in gammas:
                        row = {"drafter": kind, "block": d.config.num_gamma, "variant": variant, "sampling": sname,
                               "gamma": gamma}
                        u = None if sp is None else torch.rand(b, gamma, device=device)  # one uniform per draw
                        row["propose_s"] = timer(lambda: d.propose(state, anchors, apos, gamma, sp, u))
                        if compiled is not None and variant == "eager":  # the drafter pass as backend "on" runs it
                            row["compiled_propose_s"] = timer(lambda: compiled[kind](state, anchors, apos, gamma,
                                                                                      sp, u))
                        hidden = torch.randn(b, gamma, d.config.hidden_size, device=device, dtype=dtype)
                        row["sample_block_s"] = timer(lambda: d.sample_block(hidden, anchors, sp, u))
                        rows.append(row)
            if kind == "dspark":
                d.use_fused_kernel = False
    return {"rows": rows}


def host_overhead(model, drafter, args, timer, device, gamma: int) -> dict:
    """Wall time of the engine's own rounds (pdraft.decode.engine.generate, greedy, full verification: propose,
    verify, acceptance, commit, extend_context; RoundRecord.round_s), to set against the time of the draft and
    verify passes alone: the difference is what a round spends outside the two passes. The round is the
    engine's, not a copy of it; its context grows by the tokens each round commits (random weights: about one)."""
    from pdraft.decode.engine import generate

    cfg = model.config
    b, ctx = args.batch, args.context
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, cfg.vocab_size - 1, (b, ctx + 1), generator=g).tolist()
    with torch.no_grad():
        for _ in range(timer.warmup):
            generate(model, drafter, prompts, gamma=gamma, max_new_tokens=4)
        result = generate(model, drafter, prompts, gamma=gamma, max_new_tokens=1 + timer.repeats)
        rounds = [r.round_s for r in result.records if r.gamma == gamma and r.request == 0]  # drafted rounds
        state = drafter.new_state(b)  # the draft pass alone, on a context of the prompts' length
        feats = torch.randn(b, ctx, len(drafter.config.target_layer_ids) * cfg.hidden_size, device=device,
                            dtype=drafter.fc.weight.dtype)
        drafter.extend_context(state, feats, torch.arange(ctx, device=device).expand(b, ctx))
        anchors, apos = torch.zeros(b, dtype=torch.long, device=device), torch.full((b,), ctx, device=device)
        t_draft = timer(lambda: drafter.propose(state, anchors, apos, gamma, None, None))
    return {"gamma": gamma, "round_wall_s": statistics.median(rounds), "draft_gpu_s": t_draft}


def bench_loss(cfg, args, device, fused_ok: bool) -> dict:
    """Training loss CE + TV + confidence, forward and backward, over `--loss-positions` positions at the
    target's hidden size and vocabulary (float32, rank 256): the chunked torch path vs the fused kernels."""
    from pdraft.train.losses import drafter_loss

    n, d, v, r = args.loss_positions, cfg.hidden_size, cfg.vocab_size, 256
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g, device=device) * scale)  # noqa: E731
    h, u, conf = mk(n, d).requires_grad_(), mk(n, r).requires_grad_(), mk(n).requires_grad_()
    w2 = mk(r, v, scale=0.02).requires_grad_()
    w_lm, t_hidden = mk(v, d, scale=0.02), mk(n, d)
    ids = torch.randint(0, v, (n,), generator=g, device=device)
    weights = torch.ones(n, device=device)
    # Each call is long (the fused backward adds dW2 with atomics from every row block): 2 repeats after 1 warm-up.
    timer = Timer(device, 2, 1)

    def run(fused):
        out = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_ce=0.1,
                           alpha_tv=1.8, alpha_conf=1.0, chunk_size=1024, fused=fused)
        out.loss.backward()
        h.grad = u.grad = w2.grad = conf.grad = None

    res = {"positions": n, "hidden": d, "vocab": v, "rank": r, "torch_s": timer(lambda: run(False))}
    if fused_ok:
        res["fused_s"] = timer(lambda: run(True))
        res["ratio"] = res["torch_s"] / res["fused_s"]  # > 1: the fused kernels are faster
    return res


def train_ddp(name: str, args, device, dtype) -> dict:
    """Training throughput of the qwen3-4b-dspark recipe's drafter (5 layers, block 7, Markov rank 256,
    confidence head; 1 sequence x 512 anchors a micro-batch, the recipe's loss weights read from
    recipes/qwen3-4b-dspark.yaml) under DDP at world size 1, as `torchrun --nproc_per_node 1 -m pdraft train`
    runs it (the trainer's TrainForward and block_loss), on random target features and weights. Tokens/s counts
    supervised block positions. Must itself run under torchrun (it joins the group)."""
    from pdraft.models import build_drafter
    from pdraft.recipe import load_recipe
    from pdraft.train import distributed as dist_util
    from pdraft.train.batches import Batch, micro_generator, sample_anchors
    from pdraft.train.loop import LossSettings, TrainForward, block_loss

    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("--train-ddp runs under torchrun: torchrun --nproc_per_node 1 benchmarks/gpu_round.py ...")
    dist_util.join_group(device)
    import torch.distributed as dist

    if not dist.is_initialized():  # torchrun at world size 1: join_group leaves single processes alone
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    target = build_target(name, device, dtype)
    cfg = target.config
    seq, anchors_n = (64, 8) if args.tiny else (args.train_seq, 512)
    with torch.device(device):
        drafter = build_drafter("dspark", cfg, seed=0, mask_token_id=cfg.vocab_size - 1, num_hidden_layers=5,
                                block_size=7, markov_rank=16 if args.tiny else 256)
    drafter = drafter.to(dtype).train()
    drafter.attach_target(target)
    world = dist_util.World(rank=0, size=1, device=device, strategy="ddp")
    module = world.wrap(TrainForward(drafter))
    params = [p for p in module.parameters() if p.requires_grad]
    train = load_recipe(ROOT / "recipes" / "qwen3-4b-dspark.yaml",
                        [f"train.fused_loss={str(device.type == 'cuda').lower()}"]).train
    opt = torch.optim.AdamW(params, lr=train.lr, betas=(0.9, 0.95))  # the trainer's betas
    settings = LossSettings.from_recipe(train, drafter)
    w_lm = target.get_output_embeddings().weight
    feats = len(cfg_ids := drafter.config.target_layer_ids) * cfg.hidden_size
    g = torch.Generator(device="cpu").manual_seed(0)
    batch = Batch(input_ids=torch.randint(0, cfg.vocab_size, (1, seq), generator=g).to(device),
                  loss_mask=torch.ones(1, seq, dtype=torch.bool, device=device),
                  features=torch.randn(1, seq, feats, generator=g).to(device, dtype),
                  last_hidden=torch.randn(1, seq, cfg.hidden_size, generator=g).to(device, dtype))
    anchors, keep = sample_anchors(batch.loss_mask.cpu(), anchors_n, micro_generator(0, 0))
    anchors, keep = anchors.to(device), keep.to(device)
    tokens = [0]

    def step():
        loss, stats = block_loss(module, batch, anchors, keep, w_lm, settings)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens[0] = stats.tokens

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_s = Timer(device, args.repeats, args.warmup)(step)
    out = {"config": name, "drafter": "dspark 5 layers block 7 markov 256 + confidence", "dtype": str(dtype),
           "world_size": 1, "strategy": "ddp", "sequence": seq, "anchors": anchors_n, "layer_ids": list(cfg_ids),
           "step_s": step_s, "supervised_tokens_per_step": tokens[0], "train_tokens_per_s": tokens[0] / step_s,
           "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None)}
    dist.destroy_process_group()
    return out


def taus_from(args) -> dict:
    """{gamma or None: [tau, ...]} from --tau, else from a bench report (runs[].summary.tau), else defaults."""
    if args.tau:
        return {None: [float(x) for x in args.tau.split(",")]}
    if args.bench_json:
        report = json.loads(Path(args.bench_json).read_text())
        found: dict = {}
        for run in report.get("runs", []):
            tau = (run.get("summary") or {}).get("tau")
            if tau is not None and run.get("gamma"):
                found.setdefault(int(run["gamma"]), []).append(float(tau))
        if found:
            return found
    return {None: DEFAULT_TAUS}


def machine(device) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["note"] = "CPU dry run: NOT a GPU measurement"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def progress(name: str, what: str, t0: float, save=None) -> None:
    """One line on stderr per finished phase, and the report so far written out through `save`, so that a run
    cut off by a time limit (a lent GPU's minutes are few) still says how far it got and keeps what it measured."""
    print(f"[{name}] {what} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    if save is not None:
        save()


def run_config(name, args, device, dtype, timer, partial=None) -> dict:
    from pdraft.kernels.dispatch import use_triton

    fused_ok = use_triton(device)
    t0 = time.perf_counter()
    model = build_target(name, device, dtype)
    progress(name, "target built", t0)
    res = {"config": name, "target": {}}
    save = None if partial is None else (lambda: partial(res))
    bench_target(model, args, timer, device, res["target"], save)
    progress(name, "target step and verify 1..N timed", t0, save)
    if not args.skip_loss:
        res["loss"] = bench_loss(model.config, args, device, fused_ok)
        progress(name, "training loss timed", t0, save)
    res["drafters"] = []
    for block, gammas in ((16, (4, 8, 12, 16)), (7, (4, 7))):
        drafters = build_drafters(model, block, device, dtype)
        res["drafters"] += bench_drafters(drafters, args, timer, device, dtype, fused_ok, gammas, model)["rows"]
        if block == 16:
            res["host"] = [host_overhead(model, drafters[k], args, timer, device, 16) | {"drafter": k}
                           for k in drafters]
        del drafters
        progress(name, f"block-{block} drafters timed", t0, save)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    res["build_and_measure_s"] = time.perf_counter() - t0
    return res


def derive(res: dict, taus: dict) -> dict:
    """Ratios the issue asks for, from the measured medians."""
    tgt = res["target"]
    verify = tgt["eager_s"]
    t_step = verify[1]
    out = {"t_step_s": t_step, "speedup": [], "flatness": {}, "head_share": {}, "fused_ratio": {},
           "host_overhead": {}, "dflash2_draft_ratio": {}, "selector_share": {}}
    rows = [r for r in res["drafters"] if r["block"] == 16]

    def get(kind, variant, sampling, gamma, key="propose_s"):
        for r in rows:
            if (r["drafter"], r["variant"], r["sampling"], r["gamma"]) == (kind, variant, sampling, gamma):
                return r.get(key)
        return None

    for kind, variant in (("dflash", "eager"), ("dspark", "eager"), ("dspark", "fused"), ("dflash2", "eager")):
        for s in ("greedy", "t1"):
            a, b = get(kind, variant, s, 4), get(kind, variant, s, 16)
            if a and b:
                out["flatness"][f"{kind}/{variant}/{s}/propose_s"] = b / a  # T_draft(16) / T_draft(4)
    for s in ("greedy", "t1"):
        for variant in ("eager", "fused"):
            sb, fb = get("dspark", variant, s, 16, "sample_block_s"), get("dflash", "eager", s, 16, "sample_block_s")
            draft = get("dspark", variant, s, 16)
            if sb is not None and fb is not None and draft:
                head = max(sb - fb, 0.0)
                out["head_share"][f"{variant}/{s}"] = head / (draft + verify[min(17, max(verify))])
        e, f = get("dspark", "eager", s, 16, "sample_block_s"), get("dspark", "fused", s, 16, "sample_block_s")
        if e and f:
            out["fused_ratio"][s] = e / f  # eager loop time / fused kernel time, gamma 16
    for s in ("greedy", "t1"):  # DFlash2 against a DFlash of the same size, gamma 16
        d2, d1 = get("dflash2", "eager", s, 16), get("dflash", "eager", s, 16)
        if d2 and d1:
            out["dflash2_draft_ratio"][s] = d2 / d1
        sb2, sb1 = get("dflash2", "eager", s, 16, "sample_block_s"), get("dflash", "eager", s, 16, "sample_block_s")
        if sb2 is not None and sb1 is not None and d2:
            out["selector_share"][s] = max(sb2 - sb1, 0.0) / (d2 + verify[min(17, max(verify))])
    for h in res.get("host", []):
        gpu = h["draft_gpu_s"] + tgt["eager_s"][min(17, max(tgt["eager_s"]))]
        out["host_overhead"][h["drafter"]] = max(h["round_wall_s"] - gpu, 0.0) / h["round_wall_s"]
    # Issue 30's ratios per backend: verify(17) and the drafters' greedy pass at gamma 16 in target steps of the
    # same backend (the compiled drafter pass for backend "on").
    out["round_ratios"] = {}
    for mode, times in tgt.get("backends", {}).items():
        step = times[1]
        ratios = out["round_ratios"][mode] = {"t_step_s": step,
                                             "verify17_per_step": times[min(17, max(times))] / step}
        for kind in ("dflash", "dspark", "dflash2"):
            draft = get(kind, "eager", "greedy", 16, "compiled_propose_s" if mode == "on" else "propose_s")
            if draft:
                ratios[f"{kind}_draft16_per_step"] = draft / step
    for kind in ("dflash", "dspark", "dflash2"):
        for gamma in (4, 8, 12, 16):
            draft = get(kind, "eager", "greedy", gamma)
            ver = verify.get(min(gamma + 1, max(verify)))
            if not draft or not ver:
                continue
            for tau in taus.get(gamma, taus.get(None, [])):
                out["speedup"].append({"drafter": kind, "gamma": gamma, "tau": tau,
                                       "speedup": tau * t_step / (draft + ver)})
    return out


def print_ratios(report: dict) -> None:
    """Issue 30's round ratios per configuration and backend."""
    for res in report["results"]:
        for mode, r in res["derived"].get("round_ratios", {}).items():
            drafts = "  ".join(f"{k.split('_')[0]} draft16/step {v:.2f}" for k, v in r.items() if "draft16" in k)
            print(f"{res['config']:10} {mode:5} T_step {1000 * r['t_step_s']:.2f} ms  verify17/step "
                  f"{r['verify17_per_step']:.2f}  {drafts}  compile {res['target']['compile_s'].get(mode, 0):.1f} s")


def print_table(report: dict) -> None:
    print(f"# {report['machine'].get('gpu') or report['machine'].get('note')}; {report['machine']['date']}; "
          f"batch {report['args']['batch']}, context {report['args']['context']}, {report['args']['dtype']}")
    print(f"{'config':10} {'T_step ms':>9} {'draft16/draft4':>40} {'head share@16':>14} {'fused x':>8} "
          f"{'host %':>12} {'best speedup':>13} {'loss fused x':>13} {'dflash2/dflash@16':>18} {'selector share':>15}")
    for res in report["results"]:
        d = res["derived"]
        flat = ",".join(f"{k.split('/')[0]} {v:.2f}" for k, v in d["flatness"].items()
                        if k.endswith("greedy/propose_s") and "/eager/" in k)
        head = d["head_share"].get("eager/greedy")
        fused = d["fused_ratio"].get("greedy")
        host = ",".join(f"{100 * v:.0f}" for v in d["host_overhead"].values())
        best = max((s["speedup"] for s in d["speedup"]), default=None)
        loss = (res.get("loss") or {}).get("ratio")
        d2 = d["dflash2_draft_ratio"].get("greedy")
        sel = d["selector_share"].get("greedy")
        print(f"{res['config']:10} {1000 * d['t_step_s']:9.2f} {flat:>40} "
              f"{'-' if head is None else f'{100 * head:.2f}%':>14} {'-' if fused is None else f'{fused:.2f}':>8} "
              f"{host:>12} {'-' if best is None else f'{best:.2f}x':>13} {'-' if loss is None else f'{loss:.2f}':>13} "
              f"{'-' if d2 is None else f'{d2:.2f}':>18} {'-' if sel is None else f'{100 * sel:.2f}%':>15}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny configs and few repeats (CPU dry run)")
    ap.add_argument("--configs", default=None, help="comma list of " + ",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=Path("gpu_round.json"))
    ap.add_argument("--tau", default=None, help="comma list of tau values for the implied speedup")
    ap.add_argument("--bench-json", default=None, help="a pdraft bench report: its tau per gamma")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=None, help="committed tokens before the round (1024; tiny 32)")
    ap.add_argument("--max-verify", type=int, default=17, help="verify 1..N tokens (17 = anchor + 16 drafts)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--skip-loss", action="store_true", help="skip the training-loss kernel timing")
    ap.add_argument("--backends", default=None, help="decode backends to time: comma list of off,auto,on "
                                                     "(default off,auto,on on CUDA, off,auto on a CPU)")
    ap.add_argument("--train-ddp", action="store_true",
                    help="only the bf16 DDP training throughput (run under torchrun --nproc_per_node 1)")
    ap.add_argument("--train-seq", type=int, default=4096, help="sequence length of the training timing")
    ap.add_argument("--loss-positions", type=int, default=None, help="positions in the loss timing (512; tiny 64)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu --tiny for the dry run", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    args.backends = (args.backends or ("off,auto,on" if device.type == "cuda" else "off,auto")).split(",")
    args.context = args.context or (32 if args.tiny else 1024)
    args.loss_positions = args.loss_positions or (64 if args.tiny else 512)
    args.repeats = args.repeats or (3 if args.tiny else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    names = args.configs.split(",") if args.configs else (["tiny"] if args.tiny else ["qwen3-4b", "qwen3-8b"])
    dtype = getattr(torch, args.dtype)
    timer = Timer(device, args.repeats, args.warmup)
    if args.train_ddp:
        res = [train_ddp(n, args, device, dtype) for n in names[:1]]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"schema": "pdraft.gpu_train/1", "machine": machine(device), "results": res},
                                       indent=1, default=str))
        for r in res:
            print(f"[{r['config']}] train {r['train_tokens_per_s']:,.0f} tokens/s, step {r['step_s'] * 1000:.1f} ms, "
                  f"peak {r['peak_memory_gib']} GiB")
        return 0
    taus = taus_from(args)
    t0 = time.perf_counter()
    report = {"schema": "pdraft.gpu_round/1", "machine": machine(device),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "taus": {str(k): v for k, v in taus.items()}, "results": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def partial(res: dict) -> None:  # the finished configs and the one under way, marked unfinished
        args.out.write_text(json.dumps(report | {"unfinished": res}, indent=1, default=str))

    for name in names:
        res = run_config(name, args, device, dtype, timer, partial)
        res["derived"] = derive(res, taus)
        report["results"].append(res)
        print(f"[{name}] measured in {res['build_and_measure_s']:.1f} s", file=sys.stderr)
    report["total_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print_table(report)
    print_ratios(report)
    print(f"full JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
