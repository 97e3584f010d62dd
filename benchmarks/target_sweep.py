"""Sweep of embedded-target shapes and data mixes, on the builder's own token streams, to choose
`builtin:tiny-stdlib`'s build before spending an hour of CPU on it. Two steps, because the streams depend on the
interpreter's standard library and a GPU machine may run another Python:

    python benchmarks/target_sweep.py dump --vocab 2048 --out sweep/        # here: streams + tokenizer + prompts
    python benchmarks/target_sweep.py run NAME [NAME ...] --data sweep/ --device cuda --out results/

`dump` writes the training streams exactly as `pdraft target build` makes them (corpus, tokenizer, chat wrapping
at 0.3 and 0.5), the held-out code and prose streams, and the first 100 held-out code prompts (raw and chat form)
plus "def fib(n):". `run` trains each named configuration with the builder's recipe (AdamW 0.9/0.95, weight
decay 0.1 on matrices, linear warm-up then cosine to 10%, clip 1.0, random windows drawn code-or-prose per row)
and reports held-out top-1 on the fp16-rounded model (the builder's own `evaluate`) and the loop share of
greedy 64-token continuations (`pdraft.targets.builtin.quality.has_loop`). It needs only torch, transformers and
tokenizers, so it runs on a bare GPU machine with `PYTHONPATH=.`. The training loop is this script's own copy of
the builder's (the builder's must stay byte-for-byte what built the shipped weights); its batches are drawn
in the same order but on the GPU the sums differ, so a configuration's figures are the builder's to within
noise, not bit for bit.

Figures: docs/TARGET.md (one H200, 2026-11-30, 5-9 configurations side by side per call).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> overrides of BASE; `tokens` = steps x batch x seq.
BASE = dict(vocab=4096, h=256, L=4, steps=900, lr=2.5e-3, warmup=50, seq=256, bs=8, code=0.7, chat=0.3)
CONFIGS = {
    "base4": dict(),                                                       # the 2026-11 shipped build
    "a8_lr25": dict(L=8, steps=3000),
    "b8_lr10": dict(L=8, steps=3000, lr=1e-3),
    "c8_lr15": dict(L=8, steps=3000, lr=1.5e-3, warmup=100),
    "d8_2000": dict(L=8, steps=2000, lr=1.5e-3, warmup=100),
    "e8_chat5": dict(L=8, steps=3000, lr=1.5e-3, warmup=100, chat=0.5, code=0.6),
    "f384x6": dict(h=384, L=6, steps=2000, lr=1.5e-3, warmup=100),
    "g6_4000": dict(L=6, steps=4000, lr=1.5e-3, warmup=100),
    "h8_seq512": dict(L=8, steps=3000, lr=1.5e-3, warmup=100, seq=512, bs=4),
    "v2k_6": dict(vocab=2048, L=6, steps=3600, lr=1.5e-3, warmup=100),
    "v2k_6_c8ch5": dict(vocab=2048, L=6, steps=3600, lr=1.5e-3, warmup=100, code=0.8, chat=0.5),
    "v4k_4": dict(L=4, steps=4900, lr=1.5e-3, warmup=100),
    "v2k_4_c8ch5": dict(vocab=2048, L=4, steps=4900, lr=1.5e-3, warmup=100, code=0.8, chat=0.5),
    "v4k_6_c8ch5": dict(L=6, steps=3600, lr=1.5e-3, warmup=100, code=0.8, chat=0.5),
    "candidate": dict(vocab=2048, L=6, steps=7000, lr=1.5e-3, warmup=100, code=0.6, chat=0.5),  # docs/TARGET.md
    "smoke": dict(vocab=512, h=64, L=1, steps=20, lr=1e-3),                           # seconds on a CPU: checks the script
}


def dump(vocab: int, out: Path) -> None:
    import torch

    from pdraft.targets.builtin import corpus as corpus_mod
    from pdraft.targets.builtin import prompt_set_path
    from pdraft.targets.builtin.builder import ENDOFTEXT, SAMPLE_PROMPT, _encode, _format_documents
    from pdraft.targets.builtin.tokenizer import IM_END, IM_START, train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    c = corpus_mod.load_corpus()
    tok = train_tokenizer(c.train_code + c.train_prose, vocab)
    data = {}
    for chat in (0.3, 0.5):
        rng = random.Random(0)  # the builder's order: code documents first, then prose, one generator
        data[f"code_{chat}"] = _encode(tok, _format_documents(c.train_code, rng, chat)).short()
        data[f"prose_{chat}"] = _encode(tok, _format_documents(c.train_prose, rng, chat)).short()
    data["held_code"] = _encode(tok, [d + ENDOFTEXT for d in c.held_out_code]).short()
    data["held_prose"] = _encode(tok, [d + ENDOFTEXT for d in c.held_out_prose]).short()
    lines = prompt_set_path("code").read_text(encoding="utf-8").splitlines()[:100]
    prompts = [SAMPLE_PROMPT] + [json.loads(line)["turns"][0] for line in lines]
    data["raw"] = [tok.encode(p).ids for p in prompts]
    data["chat"] = [tok.encode(f"{IM_START}user\n{p}{IM_END}\n{IM_START}assistant\n").ids for p in prompts]
    data["eos"] = [tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)]
    torch.save(data, out / f"data{vocab}.pt")
    tok.save(str(out / f"tok{vocab}.json"))
    print({k: len(v) for k, v in data.items()})


def run(name: str, data_dir: Path, device: str, out: Path) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pdraft.targets.builtin.builder import evaluate
    from pdraft.targets.builtin.quality import has_loop

    c = BASE | CONFIGS[name]
    data = torch.load(data_dir / f"data{c['vocab']}.pt")
    tok = Tokenizer.from_file(str(data_dir / f"tok{c['vocab']}.json"))
    code = data[f"code_{c['chat']}"].long().to(device)  # [tokens]
    prose = data[f"prose_{c['chat']}"].long().to(device)
    heads = c["h"] // 64
    cfg = Qwen3Config(vocab_size=c["vocab"], hidden_size=c["h"], intermediate_size=3 * c["h"],
                      num_hidden_layers=c["L"], num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=2, pad_token_id=0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).float().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")

    def lr_at(step: int) -> float:
        if step < c["warmup"]:
            return c["lr"] * (step + 1) / c["warmup"]
        frac = (step - c["warmup"]) / max(1, c["steps"] - c["warmup"])
        return c["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    model.train()
    for step in range(c["steps"]):
        use_code = torch.rand(c["bs"], generator=gen) < c["code"]  # [bs]
        rows = []
        for is_code in use_code.tolist():
            stream = code if is_code else prose
            s = int(torch.randint(0, len(stream) - c["seq"] - 1, (1,), generator=gen))
            rows.append(stream[s: s + c["seq"] + 1])
        batch = torch.stack(rows)  # [bs, seq+1]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1]).logits  # [bs, seq, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    train_s = time.time() - t0
    model = model.half().float().eval()  # what would ship

    res = {"name": name, "config": c, "params": sum(p.numel() for p in model.parameters()),
           "train_s": round(train_s, 1),
           # the builder's own held-out windows (256 tokens, 32,768 per domain)
           "code_top1": evaluate(model, data["held_code"].long().to(device), 256, 32768)["top1"],
           "prose_top1": evaluate(model, data["held_prose"].long().to(device), 256, 32768)["top1"]}
    eos = data["eos"]
    for form in ("raw", "chat"):
        conts = []
        for ids in data[form]:
            x = torch.tensor([ids], device=device)
            with torch.no_grad():
                y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=64, do_sample=False,
                                   eos_token_id=eos, pad_token_id=0)[0, len(ids):].tolist()
            conts.append(y[: next((j for j, t in enumerate(y) if t in eos), len(y))])
        res[f"fib_{form}"] = tok.decode(conts[0])
        res[f"loop_{form}"] = round(sum(has_loop(y) for y in conts[1:]) / (len(conts) - 1), 3)
        res[f"samples_{form}"] = [tok.decode(y) for y in conts[1:4]]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("name", "params", "train_s", "code_top1", "prose_top1", "loop_raw",
                                          "loop_chat")}), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--vocab", type=int, default=2048)
    d.add_argument("--out", type=Path, default=Path("sweep"))
    r = sub.add_parser("run")
    r.add_argument("names", nargs="+", choices=sorted(CONFIGS))
    r.add_argument("--data", type=Path, default=Path("sweep"))
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "sweep")))
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.vocab, args.out)
    else:
        for name in args.names:
            run(name, args.data, args.device, args.out)


if __name__ == "__main__":
    main()
