"""Kernel timelines of triton_fused calls per public workload: which kernel ran on which stream, from when to when.
GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/timeline.py [--workloads 5,15] [--calls 3] \
        [--variant 'one stream: plan.on_one_stream()'] --out timeline.jsonl

Stage times measured alone do not add up to the whole backward: stages on the two streams share the SMs, a kernel
issued on one stream waits for SMs that a persistent kernel on the other holds, and one stage's tail overlaps the
next stage's start. A timeline shows that.

Each call runs as the harness times it: after warm-up calls, with the L2 flushed by the harness's flusher and a GPU
spin ahead of it, so that every launch is queued before the first kernel starts. The times are CUPTI's kernel
records through torch.profiler, in microseconds from the call's first kernel; the stream is "caller" for the
stream the call was issued on (the solution's caller) and "side" for any other. Kernels of the same name are told
apart by their launch grid. Each invocation appends a provenance header and then its rows to --out (JSON lines).

Each workload's bucket plan is profiled, and each --variant of it (the syntax of plan_ab.py), --calls times each: the
order in which two streams' kernels take the SMs can differ from call to call. A profiled call is not a timed one (the
profiler adds host time to each launch and can reorder close plans): rank plans by plan_ab.py; read a timeline for
where the time goes.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path

import torch
from plan_ab import parse_variant, variant_plans
from torch.profiler import ProfilerActivity, profile

from harness.provenance import collect, read_clocks
from harness.registry import get_solution
from harness.runner import allocate_outputs
from harness.timing import SPIN_CYCLES_PER_SECOND, L2Flusher
from harness.workloads import load_named_suite
from reference import generate_inputs
from reference.problem import INPUTS, Dims

WARMUP_CALLS = 3
HEAD_START_SECONDS = 5e-3  # the GPU spin ahead of the profiled call: longer than the host needs to issue it


def kernel_records(trace: dict) -> list[dict]:
    """The kernel records of a Chrome trace that torch.profiler exported, in start order."""
    kernels = [event for event in trace["traceEvents"] if event.get("cat") == "kernel"]
    return sorted(kernels, key=lambda event: event["ts"])


def profiled_call(run, arguments: list[torch.Tensor], flush: L2Flusher) -> list[dict]:
    """One call after the flush and the spin; its kernels as {kernel, grid, stream, start_us, end_us}."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush()
        torch.cuda._sleep(int(HEAD_START_SECONDS * SPIN_CYCLES_PER_SECOND))
        run(*arguments)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        kernels = kernel_records(json.loads(path.read_text()))
    spin = max(i for i, k in enumerate(kernels) if "spin" in k["name"] or "sleep" in k["name"])
    caller_stream = kernels[spin]["args"]["stream"]
    call = kernels[spin + 1 :]
    if not call:
        raise RuntimeError("the profiler recorded no kernel of the call after the spin")
    start = call[0]["ts"]
    return [
        {
            "kernel": k["name"],
            "grid": k["args"].get("grid"),
            "stream": "caller" if k["args"]["stream"] == caller_stream else "side",
            "start_us": round(k["ts"] - start, 1),
            "end_us": round(k["ts"] + k["dur"] - start, 1),
        }
        for k in call
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="timeline.jsonl")
    parser.add_argument("--workloads", help="comma-separated indices of the public suite (default: all 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=1, help="profiled calls per plan")
    parser.add_argument("--variant", action="append", default=[], help="'name: expression', as plan_ab.py takes it (repeatable)")
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    module = sys.modules[run.__module__]
    variants = dict(parse_variant(text) for text in args.variant)
    device = torch.device("cuda")
    flush = L2Flusher(device)
    workloads = list(enumerate(load_named_suite("public").workloads))
    if args.workloads:
        chosen = {int(i) for i in args.workloads.split(",")}
        workloads = [(i, w) for i, w in workloads if i in chosen]
    out = Path(args.out)
    header = collect(device, read_clocks(device)).model_dump(mode="json")
    with out.open("a") as handle:  # several invocations may share one file: each adds its header and rows
        handle.write(json.dumps(header) + "\n")
    for index, workload in workloads:
        dims: Dims = workload.dims
        inputs = generate_inputs(dims, args.seed, "cuda")
        arguments = [inputs[spec.name] for spec in INPUTS] + allocate_outputs(workload, device)
        plans = variant_plans(module, module.plan_for(dims.num_tokens), variants)
        for name, plan in plans.items():
            call = functools.partial(module.backward, plan=plan)
            for _ in range(WARMUP_CALLS):
                call(*arguments)
            torch.cuda.synchronize()
            for repeat in range(args.calls):
                kernels = profiled_call(call, arguments, flush)
                span = max(k["end_us"] for k in kernels)
                print(
                    f"#{index} B={dims.batch_seq_len} T={dims.num_tokens} {name} call {repeat}: "
                    f"{span:.1f} us from the first kernel's start to the last end"
                )
                with out.open("a") as handle:
                    for k in kernels:
                        print(
                            f"  {k['stream']:6} {k['kernel'][:32]:32} grid {k['grid']!s:16} {k['start_us']:8.1f} -> "
                            f"{k['end_us']:8.1f}  ({k['end_us'] - k['start_us']:.1f})"
                        )
                        row = {
                            "index": index,
                            "uuid": workload.uuid,
                            "B": dims.batch_seq_len,
                            "T": dims.num_tokens,
                            "plan": name,
                            "call": repeat,
                            **k,
                        }
                        handle.write(json.dumps(row) + "\n")
        del inputs, arguments
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
