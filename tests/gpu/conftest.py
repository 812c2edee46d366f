"""GPU tests: run on a CUDA machine with `pytest -m cuda tests/gpu`; skipped elsewhere."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
