"""Kernel timelines of triton_fused calls per workload of a suite: which kernel ran on which stream, from when to when.
GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/timeline.py [--suite step] [--workloads 5,15] [--calls 3] \
        [--variant 'one stream: plan.on_one_stream()'] --out timeline.jsonl

Stage times measured alone do not add up to the whole backward: stages on the two streams share the SMs, a kernel
issued on one stream waits for SMs that a persistent kernel on the other holds, and one stage's tail overlaps the
next stage's start. A timeline shows that.

Each call is profiled as the harness's `bench --kernels` profiles one (harness.attribution), after warm-up calls, with
the L2 flushed, but behind a GPU spin long enough for the host to queue every launch first, as under the device-time
timer: the offsets show how the kernels share the GPU, not where it waits for the host. Times are CUPTI's records in
microseconds from the call's first kernel; the stream is CUDA's number for it. Of --calls profiled calls, the one of
median span is printed and written. Each workload's bucket plan is profiled, and each --variant of it (the syntax of
plan_ab.py). Each invocation appends a provenance header and then its rows to --out (JSON lines). A profiled call is
not a timed one (the profiler adds host time to each launch): rank plans by plan_ab.py; read a timeline for where the
time goes.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
from plan_ab import parse_variant, variant_plans

from harness.attribution import profile_kernels
from harness.provenance import collect, read_clocks
from harness.registry import get_solution
from harness.runner import allocate_outputs
from harness.workloads import load_named_suite
from reference import generate_inputs
from reference.problem import INPUTS

WARMUP_CALLS = 3
HEAD_START_SECONDS = 5e-3  # the GPU spin ahead of the profiled call: longer than the host needs to issue it


def backward_call(module, arguments: list[torch.Tensor], plan, index: int) -> None:
    """One call of a profile (profile_kernels passes its number as `index`): the whole backward on the same arguments."""
    module.backward(*arguments, plan=plan)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="timeline.jsonl")
    parser.add_argument("--workloads", help="comma-separated indices of the suite's workloads (default: all)")
    parser.add_argument("--suite", default="public", help="workload suite (workloads/NAME.yaml); default: public")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per plan (the median one is shown)")
    parser.add_argument("--variant", action="append", default=[], help="'name: expression', as plan_ab.py takes it (repeatable)")
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    module = sys.modules[run.__module__]
    variants = dict(parse_variant(text) for text in args.variant)
    device = torch.device("cuda")
    workloads = list(enumerate(load_named_suite(args.suite).workloads))
    if args.workloads:
        chosen = {int(i) for i in args.workloads.split(",")}
        workloads = [(i, w) for i, w in workloads if i in chosen]
    out = Path(args.out)
    with out.open("a") as handle:  # several invocations may share one file: each adds its header and rows
        handle.write(json.dumps(collect(device, read_clocks(device)).model_dump(mode="json")) + "\n")
    for index, workload in workloads:
        dims = workload.dims
        inputs = generate_inputs(dims, args.seed, "cuda")
        arguments = [inputs[spec.name] for spec in INPUTS] + allocate_outputs(workload, device)
        for name, plan in variant_plans(module, module.plan_for(dims.num_tokens), dims, variants).items():
            call = functools.partial(backward_call, module, arguments, plan)
            for i in range(WARMUP_CALLS):
                call(i)
            timeline = profile_kernels(call, lambda i: None, device, args.calls, HEAD_START_SECONDS)
            print(f"#{index} B={dims.batch_seq_len} T={dims.num_tokens} {name}: {timeline.span_us:.1f} us from the first "
                  f"kernel's start to the last end (median of {timeline.calls}){'; ' + timeline.note if timeline.note else ''}")  # fmt: skip
            with out.open("a") as handle:
                for k in timeline.kernels:
                    end = k.start_us + k.duration_us
                    print(f"  {k.stream:4} {k.name[:40]:40} {k.start_us:8.1f} -> {end:8.1f}  ({k.duration_us:.1f})")
                    row = {"index": index, "uuid": workload.uuid, "B": dims.batch_seq_len, "T": dims.num_tokens,
                           "plan": name, **k.model_dump()}  # fmt: skip
                    handle.write(json.dumps(row) + "\n")
        del inputs, arguments
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
