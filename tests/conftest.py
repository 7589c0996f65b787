from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# Without a GPU, Triton kernels run in Triton's CPU interpreter. The variable must be set before triton is
# first imported: triton.language's own jit'd helpers are created at that import.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (run on the H200: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def make_solution(tmp_path: Path):
    """Write a solution folder (solution.yaml + solution.py) under tmp_path/solutions and return that folder."""
    root = tmp_path / "solutions"

    def make(name: str, body: str, dps: bool = True, devices: str = "[cpu, cuda]", extra_yaml: str = "") -> Path:
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "solution.yaml").write_text(
            f"name: {name}\ndescription: test solution {name}\nauthor: tests\nlanguage: python\n"
            f"devices: {devices}\ndestination_passing_style: {str(dps).lower()}\n{extra_yaml}"
        )
        (folder / "solution.py").write_text(textwrap.dedent(body))
        return root

    return make
