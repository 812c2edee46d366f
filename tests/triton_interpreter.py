"""A fixture for Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, CPU): shared by the kernel
tests, imported into their modules (pytest finds fixtures by name there)."""

from __future__ import annotations

import pytest
import triton.language as tl
import triton.runtime.interpreter as triton_interpreter
from triton.runtime.jit import JITFunction

INTERPRETING = not isinstance(tl.cdiv, JITFunction)  # triton was imported with TRITON_INTERPRET=1


def patch_loop_bounds(setattr_=setattr) -> None:
    """Triton 3.6's interpreter turns a runtime loop bound into an int with int() of a one-element array,
    which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be converted"); take the element instead.
    `setattr_`: how to set it (a monkeypatch's, to undo it after a test; plain setattr in a worker process)."""
    original = triton_interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    setattr_(triton_interpreter, "_patch_lang_tensor", patch)


@pytest.fixture(autouse=True)
def interpreter_loop_bounds(monkeypatch):
    """patch_loop_bounds for the test, where Triton interprets."""
    if INTERPRETING:
        patch_loop_bounds(monkeypatch.setattr)
