from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from harness.registry import get_solution
from harness.runner import Bench, BenchOptions

HAS_CUDA = torch.cuda.is_available()
# Without a GPU, Triton kernels run in Triton's CPU interpreter. The variable must be set before triton is
# first imported: triton.language's own jit'd helpers are created at that import.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# A solution right only at the T of its first call (zeros elsewhere): it passes a workload, and fails at other T
# (bench --mixed-tokens).
ONE_SHAPE = """
from reference import reference_backward

FIRST = []

def run(*tensors):
    FIRST[:] = FIRST or [tensors[1].numel()]
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value if tensors[1].numel() == FIRST[0] else 0 * value)
"""

# A solution right for its first 25 calls only: it passes the trials and the short timings, and fails once its calls
# have run back to back (bench --sustained).
WRONG_WHEN_WARM = """
from reference import reference_backward

CALLS = []

def run(*tensors):
    CALLS.append(1)
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value if len(CALLS) <= 25 else 0 * value)
"""


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


def cpu_bench(root: Path, name: str, options: BenchOptions) -> Bench:
    """A CPU bench of solution `name` from a folder make_solution wrote, its results written beside that folder."""
    return Bench(get_solution(name, root), torch.device("cpu"), options, root.parent / "results")
