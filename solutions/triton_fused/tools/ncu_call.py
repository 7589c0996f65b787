"""One triton_fused call per workload and plan inside a profiler range, for Nsight Compute. GPU only.

    ncu --profile-from-start off --clock-control none --set full -k regex:dh_swiglu -o dh \
        python3 solutions/triton_fused/tools/ncu_call.py --workloads 14,4 [--variant 'name: expression']

Warm-up calls first (compiling, and recording the call's context), then one call between cudaProfilerStart and
cudaProfilerStop, so that `--profile-from-start off` profiles that call's kernels and nothing of the set-up. ncu runs
the kernels one at a time, each with the L2 flushed: a kernel's figures are its own, not those of the stages it shares
the GPU with in a timed call (timeline.py shows that sharing). `--clock-control none` leaves the GPU's clocks as the
timed runs have them. Each workload's bucket plan is profiled, and each --variant of it (the syntax of plan_ab.py), and
with --against another checkout's bucket plan.
"""

from __future__ import annotations

import argparse

import torch
from plan_ab import add_shared_arguments, start_session, warmed_variants


def main() -> None:
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser, "ncu_call.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    session = start_session(args)
    device = torch.device("cuda")
    for index, workload, arguments, name, solution, plan in warmed_variants(session, args.seed, device):
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        solution.backward(*arguments, plan=plan)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"#{index} B={workload.dims.batch_seq_len} T={workload.dims.num_tokens} {name}: one call profiled")


if __name__ == "__main__":
    main()
