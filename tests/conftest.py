"""Shared fixtures: tiny random models (CPU, float32); GPU tests under tests/gpu are marked `cuda` and
skipped without a GPU. The oracles, batches and shared checks live in support/ (a package: tests/ is on the
path), which every test module imports from; no test module imports another."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton's interpreter runs the kernel tests on CPU; it is chosen when Triton is first imported, which no import
    # above makes (tests/fused/test_kernel_decode_attention.py checks the kernels' CPU refusal without it).
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # `-n N`: the cores shared among the N processes, not each taking all
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402

import overlapdecode as od  # noqa: E402

# Tests that hold a worker longest, each one process group or child process of 15-110 s on 2 cores (tensor
# parallelism's torchrun launches, every kernel's sm_90 compile): dispatched first, so that under pytest-xdist the
# workers end together on short tests instead of one of them waiting out a long one alone.
FIRST = ("tests/tp/", "tests/fused/test_kernel_compile_child.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(part in item.nodeid for part in FIRST))  # stable: the rest keep their order
    for item in items:
        if "/tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(
                    pytest.mark.skip(
                        reason="needs a CUDA GPU (on a CUDA machine: python3 -m pytest -q -m cuda tests/gpu)"
                    )
                )


@pytest.fixture(scope="session")
def tiny_gpt2():
    return od.load_model("tiny-gpt2", device="cpu")


@pytest.fixture(scope="session")
def tiny_llama():
    return od.load_model("tiny-llama", device="cpu")


@pytest.fixture(scope="session", params=["tiny-gpt2", "tiny-llama"])
def tiny_model(request, tiny_gpt2, tiny_llama):
    return tiny_gpt2 if request.param == "tiny-gpt2" else tiny_llama
