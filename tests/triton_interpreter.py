"""Triton's interpreter (TRITON_INTERPRET=1) without a repeated cost of its own, for `vllm_kernels.py` and
`sglang_kernels.py`, which run vLLM's Triton sampler and SGLang's verification kernel on the CPU.

Triton 3.9's interpreter patches `triton.language` for the interpreter (`_patch_lang`: `inspect.getmembers` over its
modules) when a kernel launches, and restores it when the launch ends; but it patches the same modules again at
every call of a device function inside the kernel (`InterpretedFunction.__call__`), and never restores those: on
vLLM's rejection sampler that re-patching was about 40% of the time, on SGLang's kernel about 25%. `patch_once()`
makes a device function's call inside a launch skip it when the launch has already patched the language modules the
function sees. What the kernels compute is unchanged: the modules are patched with the same interpreted operations
either way (the scripts' outputs are bit-identical with and without it).
"""

from __future__ import annotations

import inspect


def patch_once() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    if getattr(original, "specsim_once", False):
        return
    patched: set[int] = set()  # ids of the language modules the running launch patched

    def langs(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn):
        mine = langs(fn)
        if patched and mine <= patched:  # a device function inside a launch that patched these already
            return interpreter._LangPatchScope()
        scope = original(fn)
        in_launch = bool(patched)
        patched.update(mine)
        if in_launch:
            # A device function seeing other modules (triton.language.random sees tl.core): the interpreter never
            # restores a device function's patch, so patching them once per launch is enough.
            return scope
        restore = scope.restore

        def restore_and_forget():
            restore()
            patched.clear()

        scope.restore = restore_and_forget
        return scope

    patch_lang.specsim_once = True
    interpreter._patch_lang = patch_lang
