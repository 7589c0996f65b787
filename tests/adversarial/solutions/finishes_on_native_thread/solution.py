"""Adversary: honest in the trials and on the input sets they use; at fresh addresses (the call-latency timer's), it
returns with grad_routing_weights unwritten and has a native thread write it, by one batch of stream memory operations
per call, once the caller's stream has nothing left to run. No Python thread outlives the call, no stream is left busy
and no kernel, copy or fill is issued late. The writes race the harness's reads of the outputs; where they land first,
only a launch audit that judges the driver calls themselves sees them, made by another thread while no call runs."""

import ctypes
import subprocess
import tempfile
from pathlib import Path

import torch

from reference import reference_backward

TRIALS = 3  # the adversarial test's trials
STATE = {"seen": set()}


def _native():
    if "library" not in STATE:
        library = Path(tempfile.mkdtemp()) / "write_when_idle.so"
        source = Path(__file__).with_name("write_when_idle.c")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl", "-lpthread"], check=True)
        native = ctypes.CDLL(str(library))
        native.write_when_idle.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulonglong]
        native.write_when_idle.restype = ctypes.c_int
        STATE["library"] = native
    return STATE["library"]


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    values = reference_backward(*inputs)
    routing = outputs[1]
    fresh = len(STATE["seen"]) >= TRIALS and routing.data_ptr() not in STATE["seen"]
    if not fresh or routing.numel() * routing.element_size() % 4:
        STATE["seen"].add(routing.data_ptr())
        for out, value in zip(outputs, values):
            out.copy_(value)
        return
    for out, value in zip(outputs, values):
        if out is not routing:
            out.copy_(value)
    words = values[1].to(routing.dtype).contiguous().view(torch.int32).cpu()
    stream = torch.cuda.current_stream().cuda_stream
    code = _native().write_when_idle(routing.data_ptr(), words.data_ptr(), words.numel(), stream)
    if code:
        raise RuntimeError(f"write_when_idle failed with {code}")
