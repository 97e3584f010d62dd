"""The fused CE + TV loss kernels equal the chunked torch path of pdraft.train.losses.drafter_loss: loss, every
logged term and the gradients in h, u, W2 and the confidence logits (CPU interpreter here, compiled on CUDA in
the gpu test)."""

import pytest
import torch

from pdraft.train.losses import drafter_loss, position_weights
import test_kernels_support
from test_kernels_support import needs_triton

interpret = test_kernels_support.interpret  # TRITON_INTERPRET=1 and Triton forced, a fixture


def _inputs(n, d, v, r, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    h = mk(n, d).requires_grad_()
    u = mk(n, r).requires_grad_() if r else None
    w2 = mk(v, r, scale=0.5).t().requires_grad_() if r else None  # [r, vocab] strided, as TrainOutput.seq_w2
    conf = mk(n).requires_grad_()
    w_lm, t_hidden = mk(v, d, scale=0.5), mk(n, d)
    ids = torch.randint(0, v, (n,), generator=g).to(device)
    weights = position_weights(torch.arange(n) % 7, 4.0).to(device)
    weights[-1] = 0.0  # a padding position
    return h, u, w2, conf, w_lm, t_hidden, ids, weights


def _compare(n, d, v, r, device="cpu", tol=None):
    h, u, w2, conf, w_lm, t_hidden, ids, weights = _inputs(n, d, v, r, device)
    leaves = [x for x in (h, u, w2, conf) if x is not None]
    kw = dict(u=u, w2=w2, conf_logits=conf, alpha_ce=0.3, alpha_tv=1.8, alpha_conf=1.0)
    ref = drafter_loss(h, w_lm, t_hidden, ids, weights, chunk_size=8, **kw)
    ref_grads = torch.autograd.grad(ref.loss, leaves)
    out = drafter_loss(h, w_lm, t_hidden, ids, weights, fused=True, **kw)
    grads = torch.autograd.grad(out.loss, leaves)
    tol = tol or dict(rtol=1e-5, atol=1e-6)
    for a, b in ((out.loss, ref.loss), (out.ce, ref.ce), (out.tv, ref.tv), (out.conf, ref.conf),
                 (out.accept, ref.accept)):
        torch.testing.assert_close(a, b, **tol)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, **tol)
    assert float(ref_grads[0].abs().sum()) > 0


@needs_triton
@pytest.mark.parametrize("n,d,v,r", [(37, 16, 101, 4), (20, 40, 150, 24), (16, 16, 64, 0)])
def test_fused_equals_chunked(interpret, monkeypatch, n, d, v, r):
    import pdraft.kernels.loss as kl

    calls = []
    real = kl.ce_tv
    monkeypatch.setattr(kl, "ce_tv", lambda *a, **k: calls.append(1) or real(*a, **k))
    _compare(n, d, v, r)
    assert calls, "the fused path did not run the kernel"


def test_fused_flag_is_the_torch_path_without_triton():
    """On CPU without force_triton the flag must not change anything (the chunked path runs)."""
    h, u, w2, conf, w_lm, t_hidden, ids, weights = _inputs(10, 8, 30, 4)
    a = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_tv=1.0)
    b = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_tv=1.0, fused=True)
    assert torch.equal(a.loss, b.loss)


@pytest.mark.gpu
@needs_triton
def test_fused_equals_chunked_on_cuda():
    _compare(300, 256, 32000, 64, device="cuda", tol=dict(rtol=1e-4, atol=1e-5))


@needs_triton
def test_each_mode_jits_its_own_device_function(monkeypatch):
    """Both kernels find their rows and compute their logit tiles with device functions (program_rows,
    logit_tiles): `jit` binds each, jitted for the launch's mode, in the kernel's own globals (a compiled kernel
    cannot call an interpreted function, nor an interpreted one a compiled function, and the GPU test runs after
    the interpreted ones in one process); the module keeps the plain functions."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from pdraft.kernels import loss_triton
    from pdraft.kernels.dispatch import jit

    for env, kind in (("1", InterpretedFunction), ("0", JITFunction)):
        monkeypatch.setenv("TRITON_INTERPRET", env)
        for kernel in (loss_triton.ce_tv_fwd_kernel, loss_triton.ce_tv_bwd_kernel):
            for name in ("program_rows", "logit_tiles"):
                assert isinstance(jit(kernel).fn.__globals__[name], kind), (env, kernel.__name__, name)
                assert not isinstance(getattr(loss_triton, name), (InterpretedFunction, JITFunction))


@needs_triton
def test_jit_keeps_the_kernels_constexpr_parameters(monkeypatch):
    """A kernel that calls device functions is jitted as a copy with its own globals (above); the copy must keep
    the annotations, from which Triton decides which parameters are compile-time constants. Without them the
    block sizes reached tl.arange as runtime integers and the compiled launch failed on an H200 ("arange's
    arguments must be of type tl.constexpr"), while the interpreter, which does not care, passed."""
    from pdraft.kernels import loss_triton
    from pdraft.kernels.dispatch import jit

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for kernel in (loss_triton.ce_tv_fwd_kernel, loss_triton.ce_tv_bwd_kernel):
        jitted = jit(kernel)
        assert [jitted.arg_names[i] for i in jitted.constexprs] == ["HAS_U", "BLOCK_N", "BLOCK_V", "BLOCK_D",
                                                                      "BLOCK_R"], kernel.__name__


@needs_triton
def test_an_interpreted_launch_leaves_triton_language_as_it_was(interpret):
    """Triton's interpreter patches tl.core's functions for each library device function a kernel calls and never
    puts them back; `launching` does, so that a kernel compiled later in the process (the GPU test after these)
    is traced by Triton, not by the interpreter."""
    import triton.language as tl

    modules = (tl, tl.core, tl.standard, tl.math)
    before = [dict(vars(mod)) for mod in modules]
    _compare(20, 16, 40, 4)
    for mod, names in zip(modules, before):
        assert [name for name, val in names.items() if vars(mod).get(name) is not val] == [], mod.__name__


@pytest.mark.slow
@needs_triton
def test_kernels_compile_for_a_gpu_after_the_interpreter(interpret, monkeypatch):
    """Compiled for an sm_90 GPU (no GPU needed: Triton compiles without launching) after the interpreter ran
    them in the same process, both kernels lower to PTX, their device function included: what CPU CI can say
    of the compiled path (the interpreter also runs a helper that is not jitted)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pdraft.kernels import loss_triton
    from pdraft.kernels.dispatch import jit

    _compare(20, 16, 40, 4)  # interpreted
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    sizes = dict(N="i32", D="i32", V="i32", R="i32", s_wv="i64", s_wd="i64", s_w2r="i64", s_w2v="i64")
    values = dict(HAS_U=True, BLOCK_N=16, BLOCK_V=64, BLOCK_D=64, BLOCK_R=32)
    for kernel in (loss_triton.ce_tv_fwd_kernel, loss_triton.ce_tv_bwd_kernel):
        jitted = jit(kernel)
        names = jitted.arg_names
        # constants as a launch decides them, from the jitted kernel's own parameters: a parameter that lost its
        # tl.constexpr is compiled as the runtime i32 a launch would pass for it
        consts = {names[i]: values[names[i]] for i in jitted.constexprs}
        sig = {name: "*i64" if name == "ids_ptr" else "*fp32" for name in names if name.endswith("_ptr")}
        sig |= {**sizes, **{name: "constexpr" if name in consts else "i32" for name in values}}
        assert list(sig) == list(names)
        src = ASTSource(fn=jitted, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
        assert ".entry " + kernel.__name__ in triton_compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
