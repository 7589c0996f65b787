"""Compile every kernel of triton_fused's plans for the H200 (sm_90) on a machine without a GPU: what each launch of a
plan's call would compile, with its shared memory, its SASS's local-memory accesses (spills) and one-value conversions
between floating-point types (F2F, where a Triton release may lower what another makes pairs of HADD2.F32 or F2FP) and
whether it was compiled with fused multiply-adds. No kernel runs.

    TRITON_INTERPRET=0 PYTHONPATH=. python3 solutions/triton_fused/tools/compile_sm90.py [--tokens 64,128,149]

Triton's JIT compiles for the target its active driver names: here a driver that names sm_90 (CUDA 12-13's PTX, the
ptxas and nvdisasm Triton ships) and launches nothing. Each T's call runs the launcher's code (solution._issue) on CPU
tensors of the plan's shapes with hidden 512 and ffn 1024 (the kernels specialise on dtypes, 16-byte alignment and
their constexprs, not on sizes), every launch replaced by `warmup`, which compiles it. So a kernel edit can be
checked for front-end errors, shared memory past the 227 KB an SM gives a block (the exit status is 1 then) and spills
before any device time is spent. Under the device's Triton (3.6) the binaries are the device's; later releases compile
the same sources (gluon_common.py binds the Gluon names they changed) with their own code generation.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver

from harness.registry import get_solution
from reference.problem import INPUTS, OUTPUTS, Dims

# One T per bucket of plan.PLANS, and both sides of the change of dx's tiles above 1024.
DEFAULT_TOKENS = (64, 128, 149, 192, 256, 320, 384, 1024, 2048, 2049)
SHARED_MEMORY_LIMIT = 227 * 1024  # bytes of shared memory one block may take on an H100/H200


class Sm90Driver(DriverBase):
    """A driver that names the H200's target and current device and stream, for compiling only."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise NotImplementedError("compiling only")

    def get_empty_cache_for_benchmark(self):
        raise NotImplementedError("compiling only")

    def clear_cache(self, cache) -> None:
        pass


def sass_counts(cubin: bytes) -> tuple[int | None, int | None]:
    """Local-memory loads and stores (spills) and F2F instructions (a slower pipe's, one value each) in the kernel's
    SASS, by the nvdisasm Triton ships; (None, None) without it."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        sass = subprocess.run([str(nvdisasm), "-c", file.name], capture_output=True, text=True, check=True).stdout
    return sass.count("STL") + sass.count("LDL"), len(re.findall(r"\bF2F\.", sass))


def call_tensors(tokens: int) -> list[torch.Tensor]:
    """Unwritten CPU tensors of one call at T = tokens (B = T + 1, hidden 512, ffn 1024), in the calling order."""
    dims = Dims(tokens + 1, tokens, 512, 1024)
    return [torch.empty(spec.concrete_shape(dims), dtype=spec.dtype) for spec in (*INPUTS, *OUTPUTS)]


def compile_plan(module, tokens: int) -> list[tuple[str, int, int | None, int | None, bool]]:
    """(kernel, shared memory bytes, spills, F2F conversions, FP fusion) of every launch of the call at T = tokens under
    its bucket's plan, compiled with the options the solution's launches pass."""
    tensors = call_tensors(tokens)
    plan = module.plan_for(tokens)
    p = module._new_problem(tensors, plan, torch.float16, module.StreamScratch(torch.device("cpu")))
    compiled = []

    def compile_launch(kernel, grid, stream, caller, *args, **kwargs) -> None:
        binary = kernel.warmup(*args, grid=grid, **kwargs)
        metadata = binary.metadata
        compiled.append((kernel.fn.__name__, metadata.shared, *sass_counts(binary.asm["cubin"]), metadata.enable_fp_fusion))

    p.program.launch = compile_launch
    p.begin(tensors)
    module._issue(p, plan)
    return compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="T of the calls to compile")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("compile_sm90: unset TRITON_INTERPRET (Triton's CPU interpreter compiles nothing)")
    driver.set_active(Sm90Driver())
    run = get_solution("triton_fused").load_entry_point()
    module = sys.modules[run.__module__]
    module._require_gpu = lambda tensor, kernel: None  # compiled here, never run
    over = False
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, shared, spilled, f2f, fused in compile_plan(module, tokens):
            over |= shared > SHARED_MEMORY_LIMIT
            note = "  <- over the limit" if shared > SHARED_MEMORY_LIMIT else ""
            fusion = "on" if fused else "off"
            line = f"T = {tokens:5d}  {name:28s} shared {shared:7d} B  spills {spilled}  f2f {f2f}  fp fusion {fusion}{note}"
            print(line, flush=True)
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
