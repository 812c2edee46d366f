"""A fixture for Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU): shared by the kernel
tests, imported into their modules (pytest finds fixtures by name there)."""

from __future__ import annotations

import pytest
import triton.language as tl
import triton.runtime.interpreter as triton_interpreter
from triton.runtime.jit import JITFunction

INTERPRETING = not isinstance(tl.cdiv, JITFunction)  # triton was imported with TRITON_INTERPRET=1


def patch_interpreter(setattr_=setattr) -> None:
    """Two fixes to Triton 3.6's interpreter, both in NumPy terms, and one saving. `setattr_`: how to set them (a
    monkeypatch's, to undo them after a test; plain setattr in a worker process).

    - Loop bounds: a runtime loop bound becomes an int through int() of a one-element array, which NumPy >= 2.4
      refuses ("only 0-dimensional arrays can be converted"); take the element instead.
    - tl.dot: the interpreter computes it with np.matmul, and OpenBLAS's float32 GEMM for some CPUs (its Haswell
      and Zen kernels, chosen at load time from the CPU) sums an output element's products in an order that
      depends on where the element sits in the tile: two kernels that cover the same output with tiles at other
      offsets got results an ulp apart on such a CPU and equal ones on another. Here every element is the sum of
      its own products, over k in order, then plus the accumulator, the same wherever it sits (as a GPU's
      FMA chain is), so a dot's roundings depend on its inputs alone.
    - Device functions: each call of a @triton.jit helper from a kernel (tl.sum and tl.zeros among them) patches the
      language modules again (getmembers over them: about a quarter of a whole-call kernel test's time), though the launch in progress
      or an earlier call in it patched those very modules (a helper's patches are never undone). A call whose
      modules are patched already in the launch keeps those patches; the patching and the ops are the
      interpreter's own, so what a kernel computes is unchanged."""
    original = triton_interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    setattr_(triton_interpreter, "_patch_lang_tensor", patch)

    builder = triton_interpreter.InterpreterBuilder
    dot = builder.create_dot

    def elementwise_dot(self, a, b, d, *rest):
        if a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating():  # fp8: the interpreter's own conversion
            return dot(self, a, b, d, *rest)
        acc = d.data.dtype
        # (..., M, K, 1) * (..., 1, K, N) summed over K: numpy adds the K slices one after another, elementwise
        products = a.data.astype(acc)[..., :, :, None] * b.data.astype(acc)[..., None, :, :]
        return triton_interpreter.TensorHandle(products.sum(axis=-2) + d.data, d.dtype.scalar)

    setattr_(builder, "create_dot", elementwise_dot)

    patch_lang, run = triton_interpreter._patch_lang, triton_interpreter.GridExecutor.__call__
    launches = []  # per launch in progress: the ids of the language modules it patched (None until it has)

    def langs(fn) -> set:  # the modules _patch_lang patches for `fn`: tl and tl.core, where its module names them
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_once(fn):
        if launches and launches[-1] is not None and langs(fn) <= launches[-1]:
            return _LaunchPatches()
        scope = patch_lang(fn)
        if launches:  # the launch's own patching of its kernel, or a helper's of more modules (tl.sum's: tl.core
            launches[-1] = (launches[-1] or set()) | langs(fn)  # too); either stands until the launch ends
        return scope

    def launch(self, *args, **kwargs):
        launches.append(None)
        try:
            return run(self, *args, **kwargs)
        finally:
            launches.pop()

    setattr_(triton_interpreter, "_patch_lang", patch_once)
    setattr_(triton_interpreter.GridExecutor, "__call__", launch)


class _LaunchPatches:
    """The scope of a device function's call inside a launch: the launch's patches stand, the launch restores them."""

    def restore(self) -> None:
        pass


@pytest.fixture(autouse=True)
def interpreter_patches(monkeypatch):
    """patch_interpreter for the test, where Triton interprets."""
    if INTERPRETING:
        patch_interpreter(monkeypatch.setattr)
