"""Choosing between a Triton kernel and its plain torch reference. Triton runs on CUDA tensors; everywhere
else the torch reference runs, unless a test forces the Triton path under Triton's CPU interpreter
(`TRITON_INTERPRET=1`), which executes the very same kernel source with numpy so that kernel and reference can
be compared on a machine without a GPU. Kernels are jitted lazily (`jit`) because Triton decides between
compiling and interpreting when a function is decorated, from the environment at that moment: jitting at
import would freeze whatever the environment was when some unrelated module first imported this package. The
device functions a kernel calls (`device_function`) are jitted with it, for the same mode."""

from __future__ import annotations

import contextlib
import functools
import os
import types

import torch

_forced = False


@functools.cache
def triton_importable() -> bool:
    """Whether `import triton` works here (it is optional: pip install triton)."""
    try:
        import triton  # noqa: F401
    except Exception:  # not installed, or installed but broken for this platform: use the torch references
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1 in the environment)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@contextlib.contextmanager
def force_triton():
    """Within this block `use_triton` is True on CPU tensors too, when the interpreter is on (tests)."""
    global _forced
    before, _forced = _forced, True
    try:
        yield
    finally:
        _forced = before


def use_triton(device: torch.device | str) -> bool:
    """Whether a kernel may run on tensors of `device`: CUDA with Triton installed, or CPU inside
    `force_triton()` with the interpreter on. The interpreter is never picked for CUDA tensors."""
    if not triton_importable():
        return False
    device = torch.device(device)
    if device.type == "cuda":
        return not interpreting()
    return _forced and interpreting()


_jitted: dict[tuple[object, bool], object] = {}


def device_function(fn):
    """Mark `fn` as a Triton device function: a helper the kernels of its module call, never launched itself.
    It stays a plain function in its module, like the kernels, and `jit` jits it with each kernel that calls it
    (a compiled kernel must call a compiled one, an interpreted kernel an interpreted one)."""
    fn.triton_device_function = True
    return fn


def jit(fn):
    """triton.jit(fn), made once per (function, interpreter mode) on first use. The device functions `fn` calls
    (`device_function`) are jitted for the same mode and bound under their names in a copy of fn's globals, so
    the module itself never holds a jitted object of one mode that a launch in the other would find."""
    key = (fn, interpreting())
    if key not in _jitted:
        import triton

        calls = {name: jit(value) for name in fn.__code__.co_names
                 if getattr(value := fn.__globals__.get(name), "triton_device_function", False)}
        if calls:
            bound = types.FunctionType(fn.__code__, {**fn.__globals__, **calls}, fn.__name__, fn.__defaults__,
                                       fn.__closure__)
            bound.__qualname__, bound.__doc__ = fn.__qualname__, fn.__doc__
            # FunctionType copies no annotations, and Triton reads a kernel's constexpr parameters from them
            # (KernelParam.is_constexpr): without them BLOCK_N arrived as a runtime i32 and the compiled launch
            # failed in tl.arange ("arange's arguments must be of type tl.constexpr"; the interpreter does not care)
            bound.__annotations__, bound.__kwdefaults__ = dict(fn.__annotations__), fn.__kwdefaults__
            _jitted[key] = triton.jit(bound)
        else:
            _jitted[key] = triton.jit(fn)
    return _jitted[key]


_interpreted: dict[int, object] = {}


@contextlib.contextmanager
def launching():
    """Wrap every kernel launch. Under the interpreter, Triton's own library functions (tl.argmax, tl.cumsum,
    ...) must be interpreted too, but they were jitted for compilation if Triton was imported before
    TRITON_INTERPRET was set (transformers' Qwen3 imports it): swap interpreted twins in for the duration of
    the launch and put the originals back, with whatever else the interpreter changed in those modules, so
    compiled kernels in the same process are unaffected."""
    if not interpreting():
        yield
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    modules = {tl, tl.core, tl.standard, tl.math}
    before = [(mod, dict(vars(mod))) for mod in modules]
    for mod in modules:
        for name, val in list(vars(mod).items()):
            if isinstance(val, JITFunction):
                if id(val) not in _interpreted:
                    _interpreted[id(val)] = (val, InterpretedFunction(val.fn))
                setattr(mod, name, _interpreted[id(val)][1])
    try:
        yield
    finally:
        # Put back every binding the launch changed: the twins above, and the interpreter's own patches of
        # tl.core's functions, which it makes for each library device function a kernel calls (tl.sum, ...) and
        # never undoes (Triton 3.9): left in place, a kernel compiled later in this process traces into the
        # interpreter ("'value' object has no attribute 'dtype'").
        for mod, names in before:
            for name, val in names.items():
                if vars(mod).get(name) is not val:
                    setattr(mod, name, val)


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
