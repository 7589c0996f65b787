"""triton_fused's call program (solutions/triton_fused/launch.py): recorded on a context's first call, replayed with
each later call's tensors. A stand-in kernel and stream play the JIT's and CUDA's parts, so this runs on the CPU."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from harness.registry import get_solution


def launch_module():
    run = get_solution("triton_fused").load_entry_point()
    return sys.modules[run.__module__.rsplit(".", 1)[0] + ".launch"]


@dataclass
class Descriptor:
    base: torch.Tensor
    block_shape: list[int]


class Compiled:
    """What the JIT returns: a binary whose launcher records the grid, stream and values it was handed."""

    function = "binary"
    packed_metadata = "metadata"

    def __init__(self, log: list):
        self.log = log

    def run(self, grid_x, grid_y, grid_z, stream, function, metadata, launch_metadata, enter, exit_, *values):
        self.log.append(
            ((grid_x, grid_y, grid_z), stream, [v.base.data_ptr() if isinstance(v, Descriptor) else v for v in values])
        )


class Kernel:
    """A stand-in for a JIT function: its first launch (through the JIT) is logged as a replay would be."""

    def __init__(self):
        self.log: list = []
        self.compiled = Compiled(self.log)

        def fn(x, desc, scratch, n, BLOCK=16):
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            values = [*args, kwargs.get("BLOCK", 16)]
            self.compiled.run(*(*grid, 1)[:3], "caller-stream", "binary", "metadata", None, None, None, *values)
            return self.compiled

        return jit


class Stream:
    cuda_stream = "caller-stream"


def call(program, kernel, x: torch.Tensor, scratch: torch.Tensor, descriptor: Descriptor, tensors) -> None:
    program.begin(tensors)
    descriptor.base = tensors[1]
    program.launch(kernel, (4, 2), None, Stream(), x, descriptor, scratch, 7, BLOCK=32)
    program.end()


def test_replay_puts_in_each_calls_tensors_and_keeps_the_rest() -> None:
    launch = launch_module()
    kernel, scratch = Kernel(), torch.zeros(8)
    first = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    call(program, kernel, first[0], scratch, Descriptor(first[1], [2]), first)
    assert program.recorded and len(program.operations) == 1
    later = [torch.full((4,), 2.0), torch.full((6,), 3.0)]
    program.replay(later)
    (grid, stream, values), (grid2, stream2, values2) = kernel.log
    assert grid == grid2 == (4, 2, 1) and stream == stream2 == "caller-stream"
    assert values[0] is first[0] and values2[0] is later[0]
    assert values2[1] == later[1].data_ptr() and values2[2] is scratch and values2[3:] == [7, 32]
    launched = program.operations[0]
    assert all(d.base is None for d, _ in launched.descriptors)  # the program keeps no call's tensors alive
    assert all(launched.values[position] is None for position, _ in launched.tensors)


def test_a_view_of_a_calls_tensor_leaves_the_program_unrecorded() -> None:
    launch = launch_module()
    kernel = Kernel()
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    program.begin(tensors)
    program.launch(kernel, (1,), None, Stream(), tensors[0][1:], Descriptor(tensors[1], [2]), torch.zeros(2), 1)
    program.end()
    assert not program.recorded and program.operations == []


def test_launches_outside_a_call_are_not_kept() -> None:
    """A context's kernels launched outside begin and end (a test or a sweep driving one stage) are not recorded:
    nothing accumulates, and the first call still records."""
    launch = launch_module()
    kernel, scratch = Kernel(), torch.zeros(8)
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    for _ in range(3):
        program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), scratch, 1)
    assert program.operations == [] and not program.recorded
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert program.recorded and len(program.operations) == 1


def test_a_call_that_raised_leaves_nothing_recorded() -> None:
    launch = launch_module()
    kernel, scratch = Kernel(), torch.zeros(8)
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    program.begin(tensors)
    program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), scratch, 1)
    # the call raised here: no end(); the next call records afresh
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert program.recorded and len(program.operations) == 1


# A stand-in for Triton 3.6's CUDA launcher: CudaLauncher.__call__ hands grid, stream, kernel, options, scratch and
# metadata to `launch`, a closure that encodes every descriptor argument (make_tensordesc_arg) and calls the C entry
# point `launcher`. The call program reaches past both to the entry point.
def make_tensordesc_arg(arg, metadata):
    return [("map", arg.base.data_ptr(), metadata), *arg.block_shape]


def wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        final_args, described = list(args[:13]), 0
        for i, arg in enumerate(args[13:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[described]))
                described += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)

    return inner


class CudaLauncher:
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, log: list):
        self.launch = wrap_handle_tensordesc(lambda *flat: log.append(flat), {1}, ["meta"])

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None, *args)


def test_replay_through_the_entry_point_flattens_as_the_launcher_does() -> None:
    launch = launch_module()
    kernel, scratch = Kernel(), torch.zeros(8)
    kernel.compiled.run = CudaLauncher(kernel.log)
    first = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    call(program, kernel, first[0], scratch, Descriptor(first[1], [2]), first)
    assert program.operations[0].entry is not None
    later = [torch.full((4,), 2.0), torch.full((6,), 3.0)]
    program.replay(later)
    launched, replayed = kernel.log
    head = (4, 2, 1, "caller-stream", "binary", False, True, None, None, "metadata", None, None, None)
    assert launched[:13] == replayed[:13] == head
    assert launched[13] is first[0] and replayed[13] is later[0]
    assert launched[14] == ("map", first[1].data_ptr(), "meta") and replayed[14] == ("map", later[1].data_ptr(), "meta")
    assert launched[15:] == replayed[15:] and replayed[16] is scratch
