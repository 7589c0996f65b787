"""Adversary: sets aside L2 for persisting accesses and marks w1's first 16 MiB persisting with an access-policy window on
the caller's stream, so that the next call finds them in L2 after the harness's flush."""

import ctypes

import torch

from reference import reference_backward

DRIVER = ctypes.CDLL("libcuda.so.1")
PERSISTING_L2_CACHE_SIZE = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
ACCESS_POLICY_WINDOW = 1  # CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW
PERSISTING, STREAMING = 2, 1  # CUaccessProperty
WINDOW_BYTES = 16 << 20


class Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hit_ratio", ctypes.c_float),
                ("hit_prop", ctypes.c_int), ("miss_prop", ctypes.c_int)]  # fmt: skip


class StreamAttribute(ctypes.Union):
    _fields_ = [("window", Window), ("padding", ctypes.c_char * 64)]


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    w1_weight = inputs[9]
    DRIVER.cuCtxSetLimit(PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(WINDOW_BYTES))
    value = StreamAttribute(window=Window(w1_weight.data_ptr(), WINDOW_BYTES, 1.0, PERSISTING, STREAMING))
    DRIVER.cuStreamSetAttribute(
        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ACCESS_POLICY_WINDOW, ctypes.byref(value)
    )
    for out, result in zip(outputs, reference_backward(*inputs)):
        out.copy_(result)
