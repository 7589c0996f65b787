"""First-call (compile) time of triton_fused per T bucket, against the next call, in a cold Triton cache,
and the host's time to issue one warm call (its launches return before the GPU finishes).

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=. python3 solutions/triton_fused/tools/first_call.py

Each bucket's first call compiles its kernels; the harness's correctness trials absorb it, so no timed
call compiles (tests/test_triton_fused.py::test_each_bucket_compiles_once checks the caches).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from harness.registry import get_solution
from reference import generate_inputs
from reference.problem import OUTPUTS, Dims

LARGEST_T = 2048  # the last bucket's representative (the public suite's largest T)


def arguments(dims: Dims) -> list[torch.Tensor]:
    inputs = generate_inputs(dims, 0, "cuda")
    return [*inputs.values(), *(torch.empty(spec.concrete_shape(dims), dtype=spec.dtype, device="cuda") for spec in OUTPUTS)]


def timed_call(run, dims: Dims) -> float:
    args = arguments(dims)
    torch.cuda.synchronize()
    started = time.perf_counter()
    run(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def host_issue_time(run, dims: Dims, calls: int = 20) -> float:
    """Median seconds for the host to issue one call, the GPU idle beforehand."""
    args = arguments(dims)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run(*args)
        times.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    run = get_solution("triton_fused").load_entry_point()
    module = sys.modules[run.__module__]
    print(f"{'T':>5} {'first call s':>13} {'second call ms':>15} {'compiled variants':>18} {'host issue us':>14}")
    for tokens in (
        min(limit, LARGEST_T) for limit, _ in sys.modules[f"{module.__package__}.plan"].PLANS
    ):  # each bucket's largest T
        dims = Dims(4096, tokens)
        first = timed_call(run, dims)
        second = timed_call(run, dims)
        host = host_issue_time(run, dims)
        print(f"{tokens:>5} {first:>13.2f} {second * 1e3:>15.2f} {module.compiled_variants():>18} {host * 1e6:>14.0f}")


if __name__ == "__main__":
    main()
