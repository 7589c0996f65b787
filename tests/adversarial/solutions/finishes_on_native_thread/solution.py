"""Adversary: honest in the trials and on the input sets they use; at fresh addresses (the call-latency timer's), it
returns with grad_routing_weights unwritten and has a native thread copy it in once the caller's stream has nothing
left to run. No Python thread outlives the call and no stream is left busy: only a launch audit (CUPTI) sees the copy,
issued by another thread while no call is running."""

import ctypes
import subprocess
import tempfile
from pathlib import Path

import torch

from reference import reference_backward

TRIALS = 3  # the adversarial test's trials
STATE = {"seen": set(), "pending": []}


def _native():
    if "library" not in STATE:
        library = Path(tempfile.mkdtemp()) / "copy_when_idle.so"
        source = Path(__file__).with_name("copy_when_idle.c")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl", "-lpthread"], check=True)
        native = ctypes.CDLL(str(library))
        native.copy_when_idle.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_ulonglong]
        native.copy_when_idle.restype = ctypes.c_int
        STATE["library"] = native
    return STATE["library"]


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
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
    source = values[1].to(routing.dtype).contiguous()
    STATE["pending"] = [source, *STATE["pending"][:3]]  # alive until the native copy has run
    stream = torch.cuda.current_stream().cuda_stream
    code = _native().copy_when_idle(routing.data_ptr(), source.data_ptr(), source.numel() * source.element_size(), stream)
    if code:
        raise RuntimeError(f"copy_when_idle failed with {code}")
