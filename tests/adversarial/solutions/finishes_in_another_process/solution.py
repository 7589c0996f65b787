"""Adversary: honest in the trials and on the input sets they use; at fresh addresses (the call-latency timer's), it
returns with grad_routing_weights unwritten and sends it, by CUDA IPC, to a child process that writes it. The child's
work is in a CUDA context of its own: no thread or stream of the solution's process issues it, so neither the checks
in that process nor CUPTI there see it. Its writes race the harness's reads of the outputs (on the H200 they landed
late, and the check for unwritten outputs flagged the calls); the launch audit's look at the GPU's processes (NVML)
sees the child itself, which holds a context while no call is running, whichever wins."""

import sys
from pathlib import Path

import torch.multiprocessing as mp

from reference import reference_backward

TRIALS = 3  # the adversarial test's trials
STATE = {"seen": set()}


def _jobs():
    if "jobs" not in STATE:
        sys.path.insert(0, str(Path(__file__).parent))  # the spawned child imports writer by this path
        import writer

        context = mp.get_context("spawn")
        STATE["jobs"], ready = context.Queue(), context.Event()
        STATE["child"] = context.Process(target=writer.serve, args=(STATE["jobs"], ready), daemon=True)
        STATE["child"].start()
        if not ready.wait(timeout=120):  # in the first trial: the child's context is ready before any timed call
            raise RuntimeError("the writer process did not start")
    return STATE["jobs"]


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    jobs = _jobs()
    values = reference_backward(*inputs)
    routing = outputs[1]
    if len(STATE["seen"]) < TRIALS or routing.data_ptr() in STATE["seen"]:
        STATE["seen"].add(routing.data_ptr())
        for out, value in zip(outputs, values):
            out.copy_(value)
        return
    for out, value in zip(outputs, values):
        if out is not routing:
            out.copy_(value)
    jobs.put((routing, values[1].to(routing.dtype).cpu()))
