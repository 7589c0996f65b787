"""Launcher of the fused Triton backward: scratch buffers, tensor descriptors, and the launches of each bucket's plan
(plan.py) on two streams, recorded on a call context's first call and replayed on later ones by a small C program
(launch.py, native.py and replay.c).

The kernels: kernels.py (Triton: the per-token kernels, dh, the weight gradients, dx) and the warp-specialised Gluon
kernels of dh (dh_warp_specialized.py, and dh_grad_w2.py with grad_w2 at T = 65-160), the weight gradients
(weight_grad_warp_specialized.py), dx (dx_warp_specialized.py) and dx with grad_w1/grad_w3
(dx_grad_weight_warp_specialized.py). The folder is self-contained: it needs torch and triton only (replay.c is built by
Triton's own tool for its launchers, with the C compiler Triton needs anyway), so an exported copy runs without this
repository.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from .dh_grad_w2 import dh_grad_w2_kernel
from .dh_warp_specialized import dh_swiglu_ws_kernel
from .dx_grad_weight_warp_specialized import dx_grad_weight_ws_kernel
from .dx_warp_specialized import dx_ws_kernel
from .kernels import (
    dh_swiglu_kernel,
    dx_kernel,
    gather_kernel,
    routing_x16_kernel,
    scatter_kernel,
    weight_grad_kernel,
    zero_unselected_kernel,
)
from .launch import CallProgram
from .native import layout
from .plan import (
    FUSED_BLOCK_K,
    FUSED_BLOCK_N,
    FUSED_HEAD_ROWS,
    FUSED_PRODUCT_REGS,
    ROW_PAD,
    SWAP_ACT_WIDTH,
    SWAP_BLOCK_F,
    SWAP_TAIL_ROWS,
    WS_BLOCK_K,
    WS_BLOCK_M,
    WS_PRODUCT_REGS,
    WS_SHORT_STEP,
    DhGradW2,
    FusedDxGradW13,
    GluonDh,
    GluonDx,
    GluonWeightGrad,
    Plan,
    Tile,
    TritonDh,
    TritonDx,
    TritonWeightGrad,
    WeightGrad,
    plan_for,
    weight_grad_steps,
)
from .weight_grad_warp_specialized import weight_grad_ws_kernel

# The destination-passing calling convention of the problem: 12 inputs, then 5 outputs, in this order.
INPUT_NAMES = (
    "grad_output", "token_indices", "selected_tokens", "w1_output", "gate_output", "up_output", "gated_output",
    "expert_output", "selected_weights", "w1_weight", "w2_weight", "w3_weight",
)  # fmt: skip
OUTPUT_NAMES = ("grad_hidden_states", "grad_routing_weights", "grad_w1_weight", "grad_w2_weight", "grad_w3_weight")

ROW_BLOCK_H = 512  # columns per program of the per-token kernels (gather, routing_x16, scatter): 8 per token at H = 4096
ZERO_BLOCK_H = 1024  # columns per program of zero_unselected: 4 per gap between selected rows at H = 4096
WS_BLOCK_N = 256  # columns of the Gluon weight gradient's tile
WS_STORE_WIDTH = 64  # columns per TMA store of the Gluon weight gradient
# Tile-claim counters per call (Problem.counters): grad_w2 and up to two launches of grad_w1/grad_w3 (one per weight
# where F is not a multiple of the tile's rows)
TILE_COUNTERS = 3
# Compiler options of every launch. Fused multiply-adds (one rounding for a*b + c) are asked for rather than left to
# Triton's default, which Triton 3.9 says 3.10 will turn off: the kernels round and run as measured under every Triton.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's CPU interpreter: a small persistent grid still walks several tiles per program
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_tma_alignment(tensor: torch.Tensor) -> None:
    if tensor.data_ptr() % 16 or any(stride * tensor.element_size() % 16 for stride in tensor.stride()[:-1]):
        raise ValueError(f"TMA needs 16-byte aligned bases and row strides; got a tensor of shape {tuple(tensor.shape)}")


def _descriptor(tensor: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
    _check_tma_alignment(tensor)
    return TensorDescriptor.from_tensor(tensor, block_shape)


class StreamScratch:
    """The intermediates and events of the calls made on one stream, shared by their call contexts: each context takes
    views of its size at the start of each buffer, so that a context costs no device memory of its own and many can be
    kept (a training run meets a new T for every expert of every layer). Calls on one stream are ordered, and each
    ends with the stream waiting for the side stream, so a call's intermediates are free when the next call starts."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}  # bytes, by name: no two intermediates share memory
        self.events: list[torch.cuda.Event] = []  # in the order a call records them

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous (shape, dtype) view of the start of buffer `name`, which grows (to twice its size at least)
        where it is too small: the contexts that took views of the smaller one keep it."""
        size = math.prod(shape) * dtype.itemsize
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < size:
            grown = size if buffer is None else max(size, 2 * buffer.numel())
            buffer = self.buffers[name] = torch.empty(grown, dtype=torch.uint8, device=self.device)
        return buffer[:size].view(dtype).view(shape)


@dataclass
class Problem:
    """The 12 inputs and 5 outputs of the current call, with the scratch buffers the stages pass along.

    One Problem serves every call whose plan and tensors' shapes, strides, dtypes and alignment are the same
    (call_context): its views of the stream's scratch (StreamScratch), the descriptors over them and its launch sites
    (launch.py) are made once, and each call binds its own inputs and outputs (begin).
    """

    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    precise_dtype: torch.dtype
    dx_split: int
    k_step: int  # the rows of grad_w2's last K step (Plan.grad_w2_last_step): the gather shifts ge's last block of that many
    low_copy: bool = True  # dd_low, the bf16 copy of dd (where Plan.low_copy says; None without)
    dx_to_rows: bool = False  # Plan.to_rows: dx stores the rows; the routing weights finished after routing_x16
    dx_tiles: int = 0  # dx's output tiles: with dx_to_rows and more than one partial, one arrival counter each
    # Each of dx's programs sums both halves of K (Triton's dx into the rows): one partial per slice of the split
    # rather than per half and slice, so none where it runs unsplit
    dx_sums_halves: bool = False
    write_ge: bool = True  # the gather writes ge, grad_w2's operand (not where dh computes grad_w2)
    plan: Plan | None = None  # the plan whose calls the Problem serves (call_context keys it by the plan's identity)
    # Where the intermediates live: call_context hands every context on one stream the same; None, the Problem's own
    scratch: StreamScratch | None = None
    # Launches of the Gluon weight gradient so far in this call that claim their tiles, each from its own counter
    weight_grad_launches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        batch, hidden = self.inputs["grad_output"].shape
        self.batch, self.hidden = batch, hidden
        self.tokens = self.inputs["token_indices"].numel()
        self.rows = triton.cdiv(self.tokens, ROW_PAD) * ROW_PAD
        self.ffn = self.inputs["w1_weight"].shape[0]
        self.device, operand = self.inputs["grad_output"].device, self.inputs["grad_output"].dtype
        self.routing_chunks = triton.cdiv(hidden, ROW_BLOCK_H)
        if self.scratch is None:
            self.scratch = StreamScratch(self.device)
        take = self.scratch.take
        self.g = take("g", (self.rows, hidden), operand)
        self.ge = take("ge", (self.rows, hidden), operand)
        self.x_precise = take("x_precise", (self.rows, hidden), self.precise_dtype)
        self.routing_partials = take("routing_partials", (self.tokens, self.routing_chunks), torch.float32)
        self.dd = take("dd", (self.rows, 2 * self.ffn), self.precise_dtype)
        self.dd_low = take("dd_low", (self.rows, 2 * self.ffn), operand) if self.low_copy else None
        # one partial per half and slice of K, or per slice where a program sums both halves; none for a single one
        # that dx stores into the rows itself
        partials = self.dx_split if self.dx_sums_halves else 2 * self.dx_split
        self.partials = take("partials", (partials, self.tokens, hidden), operand) if partials > 1 else None
        # The call's counters, which the gather (the first kernel on either stream) zeroes: the dynamic Gluon weight
        # gradient's tile claims, one per launch, then dx's arrivals (with dx_to_rows and more than one partial)
        split_to_rows = self.dx_to_rows and partials > 1
        self.counters = take("counters", (TILE_COUNTERS + (self.dx_tiles if split_to_rows else 0),), torch.int32)
        if self.counters.numel() > self.rows * self.routing_chunks:
            raise ValueError(
                f"the gather's {self.rows * self.routing_chunks} programs zero the call's counters, one each: "
                f"too few for {self.counters.numel()}"
            )
        self.arrivals = self.counters[TILE_COUNTERS:] if split_to_rows else None
        self.program = CallProgram(record=self.device.type == "cuda")
        # The call's descriptors, in the order the call asks for them (the same in every call of this Problem), made on
        # the first call and reused: a descriptor gets the call's tensor as its base (shape, strides and block are the
        # Problem's). Its events, likewise, are the stream's (StreamScratch.events).
        self._descriptors: list[TensorDescriptor | GluonTensorDescriptor] = []
        self._next_descriptor = self._next_event = 0
        # the stream the calls are made on (call_context keys the Problem by it; CUDA only)
        self.caller = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        self.issuing: torch.cuda.Stream | None = None  # where launches go: None for the caller's stream

    def begin(self, tensors: Sequence[torch.Tensor]) -> None:
        """Bind one call's inputs and outputs (INPUT_NAMES, then OUTPUT_NAMES) for the launcher's code; its launches,
        descriptors, events and tile counters start from the first."""
        self.inputs, self.outputs = dict(zip(INPUT_NAMES, tensors[:12])), dict(zip(OUTPUT_NAMES, tensors[12:]))
        self.program.begin(tensors)
        self.weight_grad_launches = self._next_descriptor = self._next_event = 0
        self.issuing = None

    def end(self, completed: bool = True) -> None:
        """The launcher's code has issued (or described) the call, or raised (not `completed`): let go of its tensors
        (the descriptors' bases included)."""
        self.program.end(completed)
        self.inputs = self.outputs = {}
        for descriptor in self._descriptors:
            descriptor.base = None

    def launch(self, kernel: object, grid: tuple[int, ...], *args: object, **kwargs: object) -> None:
        self.program.launch(kernel, grid, self.issuing, self.caller, *args, **kwargs, **COMPILE_OPTIONS)

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event | None) -> None:
        """`stream` waits for the work that `event` marks (nothing without an event: all work is on one stream)."""
        if event is not None:
            self.program.wait(stream, event)

    @contextlib.contextmanager
    def issuing_on(self, stream: torch.cuda.Stream) -> Iterator[None]:
        """Launches of the block go to `stream` (set here rather than as torch's current stream, which costs more)."""
        self.issuing = stream
        try:
            yield
        finally:
            self.issuing = None

    def descriptor(self, tensor: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
        return self._descriptor_of(tensor, block_shape, _descriptor)

    def gluon_descriptor(self, tensor: torch.Tensor, block_shape: list[int]) -> GluonTensorDescriptor:
        return self._descriptor_of(tensor, block_shape, _gluon_descriptor)

    def _descriptor_of(self, tensor: torch.Tensor, block_shape: list[int], make: Callable) -> object:
        """The call's next descriptor, over `tensor`: made (and checked) on the first call, on later ones the same
        object with `tensor` as its base; call_context keys the Problem by everything else a descriptor holds."""
        if self._next_descriptor == len(self._descriptors):
            self._descriptors.append(make(tensor, block_shape))
        descriptor = self._descriptors[self._next_descriptor]
        self._next_descriptor += 1
        descriptor.base = tensor
        return descriptor

    def recorded_event(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """An event marking the work issued so far on `stream` (None without a side stream: all work is in order)."""
        if stream is None:
            return None
        events = self.scratch.events
        if self._next_event == len(events):
            events.append(torch.cuda.Event())
        event = events[self._next_event]
        self._next_event += 1
        self.program.record(event, stream)
        return event

    def tile_counter(self) -> torch.Tensor:
        """The tile-claim counter of the next launch of the Gluon weight gradient in this call."""
        if self.weight_grad_launches == TILE_COUNTERS:
            raise ValueError(f"the call has {TILE_COUNTERS} tile counters for the Gluon weight gradient's launches")
        self.weight_grad_launches += 1
        return self.counters[self.weight_grad_launches - 1 :]

    def halves(self, dd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The d_a and d_up column halves of a (rows, 2F) buffer (dd or dd_low)."""
        return dd[:, : self.ffn], dd[:, self.ffn :]


def gather(p: Problem, write_g: bool = True, launch_dependents: bool = False) -> None:
    """ge (where p.write_ge), and g unless dh gathers its own rows (write_g False: p.g is then left unwritten and
    unused); with launch_dependents the next kernel on the stream may be launched as a programmatic dependent before it
    ends."""
    if launch_dependents:  # the dependent is a Gluon dh (Plan.dh_after_gather)
        _require_gpu(p.g, "dh")
    i = p.inputs
    last_step = (p.tokens - 1) // p.k_step * p.k_step
    p.launch(gather_kernel, (p.rows, p.routing_chunks),
        i["grad_output"], i["token_indices"], i["selected_weights"], p.g, p.ge, p.counters, p.tokens, p.hidden,
        last_step, last_step + p.k_step - p.tokens, p.counters.numel(), BLOCK_H=ROW_BLOCK_H, WRITE_G=write_g,
        WRITE_GE=p.write_ge, LAUNCH_DEPENDENTS=launch_dependents,
    )  # fmt: skip


def routing_x16(p: Problem) -> None:
    """x16 and the routing sums' partials; where dx writes its rows itself and no scatter ends the call, the routing
    weights are finished right behind, on the same stream."""
    i = p.inputs
    p.launch(routing_x16_kernel, (p.rows, p.routing_chunks),
        i["grad_output"], i["token_indices"], i["selected_tokens"], i["expert_output"], p.x_precise, p.routing_partials,
        p.tokens, p.hidden, BLOCK_H=ROW_BLOCK_H,
    )  # fmt: skip
    if p.dx_to_rows:
        scatter(p, routing_only=True)


def zero_unselected(p: Problem) -> None:
    """Zeros in the rows of grad_hidden_states and entries of grad_routing_weights that no token selects
    (zero_unselected_kernel: a program per gap between selected rows and per column block)."""
    o = p.outputs
    block_h = min(ZERO_BLOCK_H, triton.next_power_of_2(p.hidden))
    p.launch(zero_unselected_kernel, (p.tokens + 1, triton.cdiv(p.hidden, block_h)),
        p.inputs["token_indices"], o["grad_hidden_states"], o["grad_routing_weights"], p.tokens, p.batch, p.hidden,
        BLOCK_H=block_h,
    )  # fmt: skip


def dh_swiglu(p: Problem, w: TritonDh) -> None:
    """dh and the SwiGLU backward by Triton's kernel, reading the gathered g or, where w.gathers_rows, the rows of
    grad_output that token_indices selects."""
    i, t, gathered = p.inputs, w.tile, not w.gathers_rows
    g = p.descriptor(p.g, [t.block_m, t.block_k]) if gathered else i["grad_output"]
    tiles = triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.ffn, t.block_n)
    p.launch(dh_swiglu_kernel, (tiles,),
        g, i["token_indices"], p.descriptor(i["w2_weight"], [t.block_k, t.block_n]),
        i["w1_output"], i["up_output"], i["gate_output"], p.dd, p.dd_low, i["selected_weights"], p.tokens, p.hidden, p.ffn,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, EPILOGUE_SPLIT=w.epilogue_split,
        GATHERED=gathered, LOW_COPY=p.low_copy, FAST_MATH=p.device.type == "cuda", num_warps=t.num_warps,
        num_stages=t.num_stages,
    )  # fmt: skip


def _require_gpu(tensor: torch.Tensor, kernel: str) -> None:
    if not tensor.is_cuda:
        raise ValueError(
            f"the warp-specialised {kernel} is a Gluon kernel for Hopper GPUs: Triton's CPU interpreter cannot run it"
        )


def _gluon_descriptor(tensor: torch.Tensor, block_shape: list[int]) -> GluonTensorDescriptor:
    _check_tma_alignment(tensor)
    return GluonTensorDescriptor.from_tensor(tensor, block_shape, _shared_layout(tuple(block_shape), tensor.dtype))


@functools.cache
def _shared_layout(block_shape: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The Gluon descriptors' shared-memory layout, computed once per block and dtype (several microseconds each)."""
    return gl.NVMMASharedLayout.get_default_for(
        list(block_shape), {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    )


def dh_swiglu_warp_specialized(p: Problem, w: GluonDh) -> None:
    """dh and the SwiGLU backward by the Gluon kernel: one persistent program per multiprocessor (or fewer:
    w.fewest_programs); w.after_gather: launched as a programmatic dependent of the gather, the kernel issued just
    before it on this stream."""
    _require_gpu(p.g, "dh")
    i = p.inputs
    activations = [p.gluon_descriptor(i[name], [WS_BLOCK_M, w.act_width]) for name in ("w1_output", "up_output", "gate_output")]
    tiles = triton.cdiv(p.tokens, WS_BLOCK_M) * triton.cdiv(p.ffn, w.block_n)
    programs = min(tiles, _multiprocessors(p.device))
    if w.fewest_programs:
        programs = triton.cdiv(tiles, triton.cdiv(tiles, programs))
    p.launch(dh_swiglu_ws_kernel, (programs,),
        p.gluon_descriptor(p.g, [WS_BLOCK_M, w.block_k]), p.gluon_descriptor(i["w2_weight"], [w.block_k, w.block_n]),
        *activations, p.dd, p.dd_low, i["selected_weights"], p.tokens, p.hidden, p.ffn, p.rows,
        STAGES=w.stages, ACT_BUFFERS=w.act_buffers, WAIT_FOR_GATHER=w.after_gather, LOW_COPY=p.low_copy,
        LAST_TILE_IN_RING=w.last_tile_in_ring, num_warps=8, launch_pdl=w.after_gather,
    )  # fmt: skip


def dh_grad_w2(p: Problem, w: DhGradW2) -> None:
    """dh, the SwiGLU backward and grad_w2 by one Gluon kernel, one program per SWAP_BLOCK_F columns of F, launched as
    a programmatic dependent of the gather, the kernel issued just before it on this stream (T checked by Plan.check)."""
    _require_gpu(p.g, "dh with grad_w2")
    i = p.inputs
    names = ("w1_output", "up_output", "gate_output")
    activations = [p.gluon_descriptor(i[name], [rows, SWAP_ACT_WIDTH]) for rows in (WS_BLOCK_M, SWAP_TAIL_ROWS) for name in names]
    gated = [p.gluon_descriptor(i["gated_output"], [rows, SWAP_BLOCK_F]) for rows in (WS_BLOCK_M, SWAP_TAIL_ROWS)]
    p.launch(dh_grad_w2_kernel, (triton.cdiv(p.ffn, SWAP_BLOCK_F),),
        p.gluon_descriptor(i["w2_weight"], [WS_BLOCK_K, SWAP_BLOCK_F]), p.gluon_descriptor(p.g, [WS_BLOCK_M, WS_BLOCK_K]),
        p.gluon_descriptor(p.g, [SWAP_TAIL_ROWS, WS_BLOCK_K]), *gated,
        p.gluon_descriptor(p.outputs["grad_w2_weight"], [WS_BLOCK_K, SWAP_BLOCK_F]), *activations, p.dd,
        i["selected_weights"], p.tokens, p.hidden, p.ffn, p.rows, STAGES=w.stages, HAS_TAIL=w.tail, num_warps=8,
        launch_pdl=True,
    )  # fmt: skip


def _weight_grad(
    p: Problem, w: TritonWeightGrad, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, c_high: torch.Tensor | None = None
) -> None:
    """[c; c_high] = a^T @ b over the T tokens by Triton's kernel, with a (p.rows x M, padded), b (p.rows or T rows, N
    columns; see weight_grad_kernel), c and c_high (N columns each) stacked into M rows."""
    t, m, n = w.tile, a.shape[1], b.shape[1]
    row_tiles = triton.cdiv(m, t.block_m)
    high_from = c.shape[0] if c_high is not None else row_tiles * t.block_m  # a whole number of tiles
    store = [t.block_m, t.block_n]
    programs = tiles = row_tiles * triton.cdiv(n, t.block_n)
    if w.programs_per_sm:
        programs = min(tiles, w.programs_per_sm * _multiprocessors(p.device))
    p.launch(weight_grad_kernel, (programs,),
        p.descriptor(a, [t.block_k, t.block_m]), p.descriptor(b, [t.block_k, t.block_n]),
        p.descriptor(c, store), p.descriptor(c if c_high is None else c_high, store), p.tokens, b.shape[0], m, n, high_from,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, FLATTEN=w.flatten,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip


def _weight_grad_launch(p: Problem, w: WeightGrad) -> Callable[..., None]:
    """launch(a, b, c, c_high=None) of _weight_grad: by Triton's kernel, or by the Gluon kernel."""
    if isinstance(w, TritonWeightGrad):
        return functools.partial(_weight_grad, p, w)
    return functools.partial(_weight_grad_warp_specialized, p, w)


def grad_w2(p: Problem, w: WeightGrad) -> None:
    """grad_w2 = ge^T @ gated_output."""
    _weight_grad_launch(p, w)(p.ge, p.inputs["gated_output"], p.outputs["grad_w2_weight"])


def grad_w13(p: Problem, w: WeightGrad) -> None:
    """One launch over the 2F rows of [grad_w1; grad_w3] when F is a multiple of the tile's rows (no tile then
    straddles the two outputs), else one launch per weight."""
    w1, w3 = p.outputs["grad_w1_weight"], p.outputs["grad_w3_weight"]
    launch = _weight_grad_launch(p, w)
    if p.ffn % (w.tile.block_m if isinstance(w, TritonWeightGrad) else WS_BLOCK_M) == 0:
        launch(p.dd, p.x_precise, w1, w3)
    else:
        d_a, d_up = p.halves(p.dd)
        launch(d_a, p.x_precise, w1)
        launch(d_up, p.x_precise, w3)


def _weight_grad_warp_specialized(p: Problem, w: GluonWeightGrad, a: torch.Tensor, b: torch.Tensor,
                                  c: torch.Tensor, c_high: torch.Tensor | None = None) -> None:  # fmt: skip
    """As _weight_grad, by the Gluon kernel: whole K steps of 64 tokens, and a last one of WS_SHORT_STEP rows where at
    most that many tokens are left (a's rows past T are zeros, padded to ROW_PAD; b's too where it is padded, else its
    last step is read as the rows that end at T, as weight_grad_kernel reads it)."""
    full_steps, tail_steps = weight_grad_steps(p.tokens)
    _require_gpu(a, "weight gradient")
    m, n = a.shape[1], b.shape[1]
    tiles = triton.cdiv(m, WS_BLOCK_M) * triton.cdiv(n, WS_BLOCK_N)
    store = [WS_BLOCK_M // 2, WS_STORE_WIDTH]
    p.launch(weight_grad_ws_kernel, (min(tiles, _multiprocessors(p.device)),),
        p.gluon_descriptor(a, [WS_BLOCK_K, WS_BLOCK_M]), p.gluon_descriptor(b, [WS_BLOCK_K, WS_BLOCK_N]),
        p.gluon_descriptor(a, [WS_SHORT_STEP, WS_BLOCK_M]), p.gluon_descriptor(b, [WS_SHORT_STEP, WS_BLOCK_N]),
        p.gluon_descriptor(c, store), p.gluon_descriptor(c if c_high is None else c_high, store),
        p.tile_counter() if w.dynamic else p.counters, m, n, m if c_high is None else c.shape[0], b.shape[0], full_steps,
        tail_steps, STAGES=w.stages, BY_COLUMN=w.by_column, DYNAMIC=w.dynamic, PRODUCT_REGS=WS_PRODUCT_REGS, num_warps=4,
    )  # fmt: skip


def dx(p: Problem, d: TritonDx | GluonDx, halves: Sequence[int] = (0, 1)) -> None:
    """dx's launches for the given halves of K: 0 = d_a @ w1, 1 = d_up @ w3 (each into its own split-K partials).
    Triton's kernel, one launch per half, reads dd_low (with p.dx_to_rows one launch over both, into the selected
    rows of grad_hidden_states); the Gluon kernel reads dd and takes both halves in one launch where both are asked
    for."""
    t = d.tile
    tiles = triton.cdiv(p.tokens, t.block_m) * triton.cdiv(p.hidden, t.block_n)
    if isinstance(d, GluonDx):
        _dx_warp_specialized(p, t, tiles, halves)
        return
    rows = p.outputs["grad_hidden_states"]
    launches = []  # (a, b, a_up, b_up, first partial) per launch of dx_kernel
    if p.dx_to_rows:  # one launch over both halves, into the selected rows
        if list(halves) not in ([], [0, 1]):
            raise ValueError("dx into the rows of grad_hidden_states takes both halves of K in one launch")
        if halves:
            launches.append((*_dx_operands(p, t, 0), *_dx_operands(p, t, 1), 0))
    for half in [] if p.dx_to_rows else halves:
        a, b = _dx_operands(p, t, half)
        launches.append((a, b, a, b, half * p.dx_split))
    for a, b, a_up, b_up, first_partial in launches:
        p.launch(dx_kernel, (tiles, p.dx_split),
            a, b, a_up, b_up, rows if p.partials is None else p.partials,  # into the rows, `rows` stands in (unused)
            p.inputs["token_indices"], rows, p.tokens, p.hidden, p.ffn // p.dx_split, first_partial,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, TO_ROWS=p.dx_to_rows,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip


def _dx_operands(p: Problem, t: Tile, half: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """The descriptors of Triton's dx over one half of K: (d_a, w1) or (d_up, w3), d_a and d_up from the bf16 copy."""
    return (p.descriptor(p.halves(p.dd_low)[half], [t.block_m, t.block_k]),
            p.descriptor(p.inputs[("w1_weight", "w3_weight")[half]], [t.block_k, t.block_n]))  # fmt: skip


def _dx_warp_specialized(p: Problem, t: Tile, tiles: int, halves: Sequence[int]) -> None:
    _require_gpu(p.dd, "dx")
    if p.dx_to_rows and list(halves) not in ([], [0, 1]):
        raise ValueError("dx into the rows of grad_hidden_states takes both halves of K in one launch")
    dd = p.gluon_descriptor(p.dd, [t.block_m, t.block_k])
    w1, w3 = (p.gluon_descriptor(p.inputs[name], [t.block_k, t.block_n]) for name in ("w1_weight", "w3_weight"))
    rows = p.outputs["grad_hidden_states"]
    for first, count in _launches(halves):
        p.launch(dx_ws_kernel, (tiles, count * p.dx_split),
            dd, w1, w3, p.partials, rows if p.arrivals is None else p.arrivals, p.inputs["token_indices"], rows,
            p.tokens, p.hidden, p.ffn, p.ffn // p.dx_split, first * p.dx_split,
            STAGES=t.num_stages, TO_ROWS=p.dx_to_rows, num_warps=t.num_warps,
        )  # fmt: skip


def _launches(halves: Sequence[int]) -> list[tuple[int, int]]:
    """(first half, halves) per launch of a Gluon dx: one launch where both halves are asked for."""
    return [(0, 2)] if list(halves) == [0, 1] else [(half, 1) for half in halves]


def dx_grad_w13(p: Problem, w: FusedDxGradW13) -> None:
    """dx's 2 * p.dx_split partials and grad_w1, grad_w3 by the Gluon kernel, one launch (T and dh's rows checked by
    Plan.check)."""
    _require_gpu(p.dd, "dx with grad_w1/grad_w3")
    i, o = p.inputs, p.outputs
    weights = [p.gluon_descriptor(i[name], [FUSED_BLOCK_K, FUSED_BLOCK_N]) for name in ("w1_weight", "w3_weight")]
    grads = [p.gluon_descriptor(o[name], [FUSED_BLOCK_K, FUSED_BLOCK_N // 2]) for name in ("grad_w1_weight", "grad_w3_weight")]
    # tokens [0, 128) in one block, [128, block_m) in a tail block of their own (TMA's blocks are powers of two)
    tail = w.block_m - FUSED_HEAD_ROWS
    block_rows = (FUSED_HEAD_ROWS, tail or FUSED_HEAD_ROWS)  # without a tail, its descriptors repeat the head's
    dd = [p.gluon_descriptor(p.dd, [rows, FUSED_BLOCK_K]) for rows in block_rows]
    x = [p.gluon_descriptor(p.x_precise, [rows, FUSED_BLOCK_N]) for rows in block_rows]
    splits = 2 * p.dx_split
    p.launch(dx_grad_weight_ws_kernel, (triton.cdiv(p.hidden, FUSED_BLOCK_N), splits),
        *dd, *x, *weights, *grads, p.partials, p.tokens, p.hidden, p.ffn, 2 * p.ffn // splits,
        TAIL=tail > 0, STAGES=w.stages, PRODUCT_REGS=FUSED_PRODUCT_REGS[w.block_m], num_warps=4,
    )  # fmt: skip


def scatter(p: Problem, routing_only: bool = False) -> None:
    """The selected rows of grad_hidden_states from dx's partials and their routing weights, or only the latter."""
    o = p.outputs
    p.launch(scatter_kernel, (p.tokens, 1 if routing_only else p.routing_chunks),
        p.inputs["token_indices"], o["grad_hidden_states"] if routing_only else p.partials, p.routing_partials,
        o["grad_hidden_states"], o["grad_routing_weights"], p.tokens, p.hidden,
        SPLIT_K=0 if routing_only else 2 * p.dx_split, ROUTING_CHUNKS=p.routing_chunks, BLOCK_H=ROW_BLOCK_H,
    )  # fmt: skip


# Call contexts kept (call_context): one per T a run meets (a training run, a new T for every expert of every layer,
# each of them again in the next step), each its descriptors and C program, its intermediates in the stream's scratch.
CONTEXTS_KEPT = 1024
_CONTEXTS: collections.OrderedDict[tuple, Problem] = collections.OrderedDict()
_STREAM_SCRATCH: dict[tuple, StreamScratch] = {}  # by (device, raw stream): see StreamScratch
# The kept context whose C program last replayed a call of each (plan, precise dtype, device, stream, T): the next such
# call tries it first, and its program checks the call's tensors as it reads their addresses. call_context's key reads
# and hashes four attributes of each of the 17 tensors in Python, the largest host cost before the first launch of a
# call that follows a synchronisation, which the caller waits for in full. Keyed by T as well, since a training step
# changes T from one call to the next and meets each T again in the next step.
_LAST_REPLAYED: dict[tuple, Problem] = {}


def _stream_key(first: torch.Tensor, plan: Plan, precise_dtype: torch.dtype) -> tuple:
    """(plan's identity, precise dtype, device index, raw stream) of a call whose first tensor is `first`."""
    if first.is_cuda:
        device = first.get_device()
        return id(plan), precise_dtype, device, torch._C._cuda_getCurrentRawStream(device)
    return id(plan), precise_dtype, first.device, None


def call_context(tensors: Sequence[torch.Tensor], plan: Plan, precise_dtype: torch.dtype, stream_key: tuple) -> Problem:
    """The Problem that serves calls of this plan on tensors of these shapes, strides, dtypes and 16-byte alignment
    (which is all the kernels' specialisation depends on) on the current stream (`stream_key`): made, and the plan
    checked against the shapes, on the first such call. Keyed by the plan's identity (hashing a plan's fields costs
    microseconds per call); the context holds its plan, so no other plan can take its id while it is kept."""
    key = (*stream_key, *map(layout, tensors))
    p = _CONTEXTS.get(key)
    if p is None:
        scratch = _STREAM_SCRATCH.get(stream_key[2:])
        if scratch is None:
            scratch = _STREAM_SCRATCH[stream_key[2:]] = StreamScratch(tensors[0].device)
        p = _new_problem(tensors, plan, precise_dtype, scratch)
        _CONTEXTS[key] = p
        if len(_CONTEXTS) > CONTEXTS_KEPT:
            _, dropped = _CONTEXTS.popitem(last=False)
            for k in [k for k, kept in _LAST_REPLAYED.items() if kept is dropped]:
                del _LAST_REPLAYED[k]  # nothing keeps it (nor its views of an outgrown scratch buffer) alive
    else:
        _CONTEXTS.move_to_end(key)
    return p


def forget_call_contexts() -> None:
    """Drop every call context and the streams' scratch, so that the next call of each shape is a first call (tests)."""
    _CONTEXTS.clear()
    _LAST_REPLAYED.clear()
    _STREAM_SCRATCH.clear()


def _new_problem(tensors: Sequence[torch.Tensor], plan: Plan, precise_dtype: torch.dtype, scratch: StreamScratch) -> Problem:
    """Check that the plan can run on these tensors and make their Problem."""
    if len(tensors) != len(INPUT_NAMES) + len(OUTPUT_NAMES):
        raise ValueError(
            f"backward takes the {len(INPUT_NAMES)} inputs and {len(OUTPUT_NAMES)} outputs, not {len(tensors)} tensors"
        )
    inputs = dict(zip(INPUT_NAMES, tensors[:12]))
    outputs = dict(zip(OUTPUT_NAMES, tensors[12:]))
    hidden, ffn = inputs["grad_output"].shape[1], inputs["w1_weight"].shape[0]
    tokens = inputs["token_indices"].numel()
    plan.check(tokens, hidden, ffn)
    d = plan.dx
    dx_tiles = triton.cdiv(tokens, d.tile.block_m) * triton.cdiv(hidden, d.tile.block_n) if plan.to_rows else 0
    return Problem(
        inputs,
        outputs,
        precise_dtype,
        plan.dx_split(ffn),
        plan.grad_w2_last_step(tokens),
        plan.low_copy,
        plan.to_rows,
        dx_tiles,
        dx_sums_halves=isinstance(d, TritonDx) and d.to_rows,
        write_ge=plan.grad_w2 is not None,
        plan=plan,
        scratch=scratch,
    )


def backward(*tensors: torch.Tensor, plan: Plan | None = None, precise_dtype: torch.dtype = torch.float16) -> None:
    """The whole backward on the 12 inputs and 5 outputs named by INPUT_NAMES and OUTPUT_NAMES, in that order.

    `precise_dtype` holds d_a, d_up and x for the weight gradients (fp16 on the GPU; the CPU tests use fp32).
    """
    tokens = tensors[1].numel()
    plan = plan or plan_for(tokens)
    stream_key = _stream_key(tensors[0], plan, precise_dtype)
    last_key = (*stream_key, tokens)
    last = _LAST_REPLAYED.get(last_key)
    if last is not None and last.program.native(tensors):
        return
    p = call_context(tensors, plan, precise_dtype, stream_key)
    if p.program.records_next_call:  # the context's first call: its launches described, none issued
        _run_launcher(p, plan, tensors)
    if p is not last and p.program.native is not None and p.program.native(tensors):  # `last` refused them already
        _LAST_REPLAYED[last_key] = p
        return
    _run_launcher(p, plan, tensors)


def _run_launcher(p: Problem, plan: Plan, tensors: Sequence[torch.Tensor]) -> None:
    p.begin(tensors)
    completed = False
    try:
        _issue(p, plan)
        completed = True
    finally:
        p.end(completed)


def _issue(p: Problem, plan: Plan) -> None:
    """The launcher's code: every launch of the call on the streams the plan's schedule names, through p (which records
    them on a context's first call).

    The side stream's work at the start first waits for the caller's work before the call (the inputs). Where dh gathers
    its own rows it needs nothing computed, so it is issued first, on the caller's stream, and the gather (writing ge
    only) on the side stream; otherwise the gather runs first on the caller's stream and dh behind it. The side stream
    runs what needs nothing computed (x16 and the routing sums, the zeros of unselected rows: memory traffic beside dh's
    tensor-core work, unless the schedule puts them later), grad_w2 once ge is written, then whatever of dx, scatter and
    grad_w1/grad_w3 the schedule puts there once dh (for scatter: all of dx) is done. The caller's stream waits for x16
    (and the counters the gather zeroes) before the stages that read them and for all of the side stream at the end, so
    every buffer outlives its use there and the caller's stream sees all of the work.
    """
    s = plan.schedule
    side = _side_stream(p.g.device) if p.g.is_cuda and s.side_stream else None
    caller = p.caller if side is not None else None  # only used with a side stream
    dh_first = plan.gathers_rows
    # Without side-stream work at the start, no event or wait is issued ahead of the gather: the side stream's first
    # wait, for the gather or dh, follows the inputs already.
    side_starts = dh_first or "start" in (s.zeros_at, s.x16_at)
    inputs_ready = p.recorded_event(caller) if side_starts else None
    if dh_first:
        dh_swiglu(p, plan.dh)
        dh_done = p.recorded_event(caller)
    counters_zeroed = side_operands_ready = None
    if side_starts:
        with _after(p, side, inputs_ready):
            if dh_first:
                gather(p, write_g=False)
            # dx's arrival counters, which the gather zeroes, where the gather runs on the side stream
            counters_zeroed = p.recorded_event(side) if dh_first and p.arrivals is not None else None
            if s.zeros_at == "start":
                zero_unselected(p)
            if s.x16_at == "start":
                routing_x16(p)
            side_operands_ready = p.recorded_event(side)
    if not dh_first:
        gather(p, launch_dependents=plan.dh_after_gather)
        ge_written = p.recorded_event(caller)
        if s.dh_behind_gather:
            dh_done = _dh_behind_gather(p, plan, caller)
    with _after(p, side, None if dh_first else ge_written):  # grad_w2 once the gather has written ge
        if s.x16_at == "after_gather":
            routing_x16(p)
            side_operands_ready = p.recorded_event(side)
        if plan.grad_w2 is not None:
            grad_w2(p, plan.grad_w2)
        if s.zeros_at == "after_grad_w2":
            zero_unselected(p)
    if not (dh_first or s.dh_behind_gather):
        dh_done = _dh_behind_gather(p, plan, caller)
    if "after_dh" in (s.x16_at, s.zeros_at):
        with _after(p, side, dh_done):
            if s.zeros_at == "after_dh":
                zero_unselected(p)
            if s.x16_at == "after_dh":
                routing_x16(p)
                side_operands_ready = p.recorded_event(side)
    if counters_zeroed is not None:
        p.wait(caller, counters_zeroed)
    scatter_on_side = side is not None and s.scatter_at == "side"
    if isinstance(plan.dx, FusedDxGradW13):
        p.wait(caller, side_operands_ready)
        dx_grad_w13(p, plan.dx)
    else:
        _dx_and_grad_w13(p, plan, side, caller, dh_done, side_operands_ready, scatter_on_side)
    p.wait(caller, p.recorded_event(side))
    if not (scatter_on_side or plan.to_rows):
        scatter(p)


def _dh_behind_gather(p: Problem, plan: Plan, caller: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    """dh over the gathered copy of g, on the caller's stream behind the gather; the event that marks it done."""
    if isinstance(plan.dh, GluonDh):
        dh_swiglu_warp_specialized(p, plan.dh)
    elif isinstance(plan.dh, DhGradW2):
        dh_grad_w2(p, plan.dh)
    else:
        dh_swiglu(p, plan.dh)
    return p.recorded_event(caller)


def _dx_and_grad_w13(p: Problem, plan: Plan, side: torch.cuda.Stream | None, caller: torch.cuda.Stream | None,
                     dh_done: torch.cuda.Event | None, side_operands_ready: torch.cuda.Event | None,
                     scatter_on_side: bool) -> None:  # fmt: skip
    """dx's halves and grad_w1/grad_w3 (and scatter, where the schedule puts it on the side stream) as separate
    stages, on the streams the schedule names, once dh is done (dh_done) and x16 is written (side_operands_ready)."""
    s = plan.schedule
    on_side = [half for half in (0, 1) if side is not None and s.dx_on_side[half]]
    dx(p, plan.dx, [half for half in (0, 1) if half not in on_side])
    if s.zeros_at == "after_dx":
        zero_unselected(p)
    caller_dx_done = p.recorded_event(caller) if scatter_on_side else None
    if on_side:
        with _after(p, side, dh_done):
            dx(p, plan.dx, on_side)
    if scatter_on_side:
        with _after(p, side, caller_dx_done):  # the routing sums are ordered before it on the side stream already
            scatter(p)
    if side is not None and s.grad_w13_on_side:
        with _after(p, side, dh_done):  # x16 is ordered before it on the side stream already
            grad_w13(p, plan.grad_w13)
    else:
        p.wait(caller, side_operands_ready)
        grad_w13(p, plan.grad_w13)


@contextlib.contextmanager
def _after(p: Problem, side: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> Iterator[None]:
    """Issue the block's launches on the side stream, after the work that `event` marks (without a side stream: in
    order)."""
    if side is None:
        yield
        return
    p.wait(side, event)
    with p.issuing_on(side):
        yield


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def run(*tensors: torch.Tensor) -> None:
    """The entry point (solution.yaml): the 12 inputs, then the 5 outputs written in place, by the plan of T's bucket."""
    backward(*tensors)


def compiled_variants() -> int:
    """How many compiled binaries the twelve kernels hold (Triton's per-device caches): a test uses it to prove
    that a plan compiles once and that later calls of the plan compile nothing."""
    kernels = (
        gather_kernel, routing_x16_kernel, zero_unselected_kernel, dh_swiglu_kernel, dh_swiglu_ws_kernel,
        dh_grad_w2_kernel, weight_grad_kernel, weight_grad_ws_kernel, dx_kernel, dx_ws_kernel, dx_grad_weight_ws_kernel,
        scatter_kernel,
    )  # fmt: skip
    return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())
