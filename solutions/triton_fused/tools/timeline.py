"""Kernel timelines of triton_fused calls per workload of a suite: which kernel ran on which stream, from when to when.
GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/timeline.py [--suite step] [--workloads 5,15] [--calls 3] \
        [--variant 'one stream: plan.on_one_stream()'] [--against ROOT] --out timeline.jsonl

Stage times measured alone do not add up to the whole backward: stages on the two streams share the SMs, a kernel
issued on one stream waits for SMs that a persistent kernel on the other holds, and one stage's tail overlaps the
next stage's start. A timeline shows that.

Each call is profiled as the harness's `bench --kernels` profiles one (harness.attribution), after warm-up calls, with
the L2 flushed, but behind a GPU spin long enough for the host to queue every launch first, as under the device-time
timer: the offsets show how the kernels share the GPU, not where it waits for the host. Times are CUPTI's records in
microseconds from the call's first kernel; the stream is CUDA's number for it. Of --calls profiled calls, the one of
median span is printed and written. Each workload's bucket plan is profiled, and each --variant of it (the syntax of
plan_ab.py), and with --against another checkout's bucket plan (as plan_ab.py's). Each invocation appends a provenance
header and then its rows to --out (JSON lines). A profiled call is not a timed one (the profiler adds host time to each
launch): rank plans by plan_ab.py; read a timeline for where the time goes.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from plan_ab import add_shared_arguments, start_session, warmed_variants

from harness.attribution import profile_kernels

HEAD_START_SECONDS = 5e-3  # the GPU spin ahead of the profiled call: longer than the host needs to issue it


def backward_call(module, arguments: list[torch.Tensor], plan, index: int) -> None:
    """One call of a profile (profile_kernels passes its number as `index`): the whole backward on the same arguments."""
    module.backward(*arguments, plan=plan)


def main() -> None:
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser, "timeline.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per plan (the median one is shown)")
    args = parser.parse_args()

    session = start_session(args)
    device = torch.device("cuda")
    for index, workload, arguments, name, solution, plan in warmed_variants(session, args.seed, device):
        dims = workload.dims
        call = functools.partial(backward_call, solution, arguments, plan)
        timeline = profile_kernels(call, lambda i: None, device, args.calls, HEAD_START_SECONDS)
        print(f"#{index} B={dims.batch_seq_len} T={dims.num_tokens} {name}: {timeline.span_us:.1f} us from the first "
              f"kernel's start to the last end (median of {timeline.calls}){'; ' + timeline.note if timeline.note else ''}")  # fmt: skip
        with session.out.open("a") as handle:
            for k in timeline.kernels:
                end = k.start_us + k.duration_us
                print(f"  {k.stream:4} {k.name[:40]:40} {k.start_us:8.1f} -> {end:8.1f}  ({k.duration_us:.1f})")
                row = {"index": index, "uuid": workload.uuid, "B": dims.batch_seq_len, "T": dims.num_tokens,
                       "plan": name, **k.model_dump()}  # fmt: skip
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
