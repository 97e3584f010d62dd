"""The Triton kernel of DSpark's sequential head, fused over a whole draft block: one program per request walks
the block's positions left to right (position k needs the token drawn at k - 1), and for each position streams
the vocabulary in BLOCK_V tiles. Imported only when Triton runs (see pdraft/models/dspark/fused_seq_head.py for the
contract and the torch reference). Jitted lazily by pdraft.kernels.dispatch.jit.

Passes over the vocabulary per position (each reads one float32 row of `probs`, used as scratch):
- greedy: 1 (logits = U_k + W1[x] W2, running max and first argmax, as torch.argmax);
- sampled: 1 (scaled logits) + 1 (exp, sum) + 1 (normalise, cumulative sum, inverse CDF), plus 32 for top-k
  and 31 for top-p. Top-k and top-p are sort-free bisections over the order-preserving integer image of the
  float32 values: top-k finds the exact k-th largest scaled logit (the largest key t with at least k keys >= t),
  top-p the smallest key t whose strictly-larger mass is below top_p, which is torch's rule "keep an entry while
  the mass sorted before it is below top_p" for distinct values. Each bisection step is one counting pass, so
  top-k/top-p cost about 32x a plain pass; the Markov bias (r multiply-adds per entry) is computed once.
The Markov term reads W2 [r, vocab] once per position per request; with one program per request, a batch of 1
runs on one streaming multiprocessor, so at real vocabularies this kernel is bounded by that SM's bandwidth:
benchmarks/gpu_round.py measures it against the eager loop rather than assuming it wins."""

import triton.language as tl


def seq_head_kernel(
    base_ptr, w1_ptr, w2_ptr, anchor_ptr, u_ptr, cbase_ptr, cw_ptr,
    tok_ptr, probs_ptr, conf_ptr,
    G, V, R,
    s_w2r, s_w2v,
    temperature, top_k, top_p,
    GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
    HEAD: tl.constexpr, CONF: tl.constexpr, CONF_EMB: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs_v = tl.arange(0, BLOCK_V)
    offs_r = tl.arange(0, BLOCK_R)
    prev = tl.load(anchor_ptr + b).to(tl.int64)
    for k in range(0, G):
        row = b * G + k
        base_row = base_ptr + row * V
        out_row = probs_ptr + row * V
        if CONF:
            c = tl.load(cbase_ptr + row)
            if CONF_EMB:
                acc_c = tl.zeros([BLOCK_R], dtype=tl.float32)
                for r0 in range(0, R, BLOCK_R):
                    rr = r0 + offs_r
                    rm = rr < R
                    e = tl.load(w1_ptr + prev * R + rr, mask=rm, other=0.0).to(tl.float32)
                    wc = tl.load(cw_ptr + rr, mask=rm, other=0.0).to(tl.float32)
                    acc_c += e * wc
                c = c + tl.sum(acc_c, axis=0)
            tl.store(conf_ptr + row, c)
        # pass 1: logits U_k + W1[prev] W2; greedy keeps the first argmax, sampling stores logits / T
        best = tl.full([], float("-inf"), tl.float32)
        best_i = tl.full([], 0, tl.int64)
        mx = tl.full([], float("-inf"), tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs_v
            vm = cols < V
            x = tl.load(base_row + cols, mask=vm, other=0.0).to(tl.float32)
            if HEAD:
                acc = tl.zeros([BLOCK_V], dtype=tl.float32)
                for r0 in range(0, R, BLOCK_R):
                    rr = r0 + offs_r
                    rm = rr < R
                    e = tl.load(w1_ptr + prev * R + rr, mask=rm, other=0.0).to(tl.float32)
                    w = tl.load(w2_ptr + rr[:, None] * s_w2r + cols[None, :] * s_w2v,
                                mask=rm[:, None] & vm[None, :], other=0.0).to(tl.float32)
                    acc += tl.sum(e[:, None] * w, axis=0)
                x = x + acc
            x = tl.where(vm, x, float("-inf"))
            if GREEDY:
                cm = tl.max(x, axis=0)
                ci = tl.argmax(x, axis=0).to(tl.int64) + v0
                better = cm > best
                best_i = tl.where(better, ci, best_i)
                best = tl.where(better, cm, best)
            else:
                s = x / temperature
                tl.store(out_row + cols, s, mask=vm)
                mx = tl.maximum(mx, tl.max(s, axis=0))
        if GREEDY:
            tok = best_i
        else:
            kth = tl.full([], -2147483648, tl.int64)
            if TOP_K:  # largest key t with count(key >= t) >= top_k: the k-th largest value, exactly
                hi = tl.full([], 2147483647, tl.int64)
                for _ in range(0, 32):
                    mid = kth + (hi - kth + 1) // 2
                    above = tl.full([], 0, tl.int32)
                    for v0 in range(0, V, BLOCK_V):
                        cols = v0 + offs_v
                        vm = cols < V
                        s = tl.load(out_row + cols, mask=vm, other=0.0)
                        bits = s.to(tl.int32, bitcast=True)
                        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
                        key = tl.where(s == 0.0, 0, key)  # -0.0 == +0.0, as torch compares them
                        above += tl.sum(tl.where(vm & (key >= mid), 1, 0), axis=0)
                    take = above >= top_k
                    kth = tl.where(take, mid, kth)
                    hi = tl.where(take, hi, mid - 1)
            # pass 2: e = exp(s - max) on the kept entries, z = sum(e)
            z = tl.full([], 0.0, tl.float32)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + offs_v
                vm = cols < V
                s = tl.load(out_row + cols, mask=vm, other=0.0)
                keep = vm
                if TOP_K:
                    bits = s.to(tl.int32, bitcast=True)
                    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
                    key = tl.where(s == 0.0, 0, key)
                    keep = keep & (key >= kth)
                e = tl.where(keep, tl.exp(s - mx), 0.0)
                tl.store(out_row + cols, e, mask=vm)
                z += tl.sum(e, axis=0)
            pth = tl.full([], 0, tl.int64)
            zk = z
            if TOP_P:  # smallest key t (e >= 0: its bits) whose strictly-larger mass is below top_p
                hi = tl.full([], 2147483647, tl.int64)
                for _ in range(0, 31):
                    mid = pth + (hi - pth) // 2
                    mass = tl.full([], 0.0, tl.float32)
                    for v0 in range(0, V, BLOCK_V):
                        cols = v0 + offs_v
                        vm = cols < V
                        e = tl.load(out_row + cols, mask=vm, other=0.0)
                        key = e.to(tl.int32, bitcast=True).to(tl.int64)
                        mass += tl.sum(tl.where(vm & (key > mid), e, 0.0), axis=0)
                    ok = mass / z < top_p
                    hi = tl.where(ok, mid, hi)
                    pth = tl.where(ok, pth, mid + 1)
                zk = tl.full([], 0.0, tl.float32)
                for v0 in range(0, V, BLOCK_V):
                    cols = v0 + offs_v
                    vm = cols < V
                    e = tl.load(out_row + cols, mask=vm, other=0.0)
                    key = e.to(tl.int32, bitcast=True).to(tl.int64)
                    zk += tl.sum(tl.where(vm & (key >= pth), e, 0.0), axis=0)
            # pass 3: normalise, write the exact distribution, inverse CDF at u
            u = tl.load(u_ptr + row)
            carry = tl.full([], 0.0, tl.float32)
            cnt = tl.full([], 0, tl.int64)
            last = tl.full([], -1, tl.int64)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + offs_v
                vm = cols < V
                e = tl.load(out_row + cols, mask=vm, other=0.0)
                keep = vm
                if TOP_P:
                    keep = keep & (e.to(tl.int32, bitcast=True).to(tl.int64) >= pth)
                p = tl.where(keep, e / zk, 0.0)
                tl.store(out_row + cols, p, mask=vm)
                cdf = tl.cumsum(p, axis=0) + carry
                cnt += tl.sum(tl.where(vm & (cdf <= u), 1, 0), axis=0).to(tl.int64)
                last = tl.maximum(last, tl.max(tl.where(p > 0, cols.to(tl.int64), -1), axis=0))
                carry += tl.sum(p, axis=0)
            tok = tl.minimum(cnt, last)
        tl.store(tok_ptr + row, tok)
        prev = tok
