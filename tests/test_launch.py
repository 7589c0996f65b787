"""triton_fused's call program (solutions/triton_fused/launch.py, native.py, replay.c): recorded on a context's first
call, replayed with each later call's tensors. Stand-ins play the JIT's, Triton's launcher's and the driver's parts,
so this runs on the CPU."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.registry import get_solution

triton = pytest.importorskip("triton")
from triton.backends.nvidia import driver as nvidia_driver
from triton.tools.tensor_descriptor import TensorDescriptor


def launch_module():
    run = get_solution("triton_fused").load_entry_point()
    return sys.modules[run.__module__.rsplit(".", 1)[0] + ".launch"]


def native_module(launch):
    """The native.py beside a loaded launch module (loading the solution again would give another)."""
    return sys.modules[launch.__name__.rsplit(".", 1)[0] + ".native"]


@dataclass
class Descriptor:
    base: torch.Tensor
    block_shape: list[int]


# Stand-ins for Triton's CUDA launcher: CudaLauncher.__call__ hands grid, stream, kernel, options, scratch and
# metadata to `launch`, a closure that encodes every descriptor argument (make_tensordesc_arg: the CUtensorMap, then
# the shape as i32 and the strides as i64; for a descriptor the compiler did not lower to TMA, no metadata, its base,
# shape and strides as i64, its padding flag, then shape and strides again) and calls the C entry point `launcher`.
# Triton 3.6's closure holds the descriptors' positions and calls its module's encoder.
def make_tensordesc_arg(arg, metadata):
    shape, strides = list(arg.base.shape), list(arg.base.stride())
    if metadata is None:
        return [arg.base, *shape, *strides, False, *shape, *strides]
    return [("map", arg.base.data_ptr(), metadata), *shape, *strides]


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


# From Triton 3.8 the closure holds a tree of the descriptors' paths into tuple parameters, their metadata (None where
# none was lowered to TMA) and an encoder that takes the launch's other arguments too; the decomposition of a
# descriptor not lowered to TMA has a second flag (TF32 rounding, as from 3.7).
def wrap_handle_tensordesc_impl(launcher, relevant_paths, tensordesc_meta, make_tensordesc_arg):
    def inner(*args):
        final_args, described = list(args[:13]), 0
        for i, arg in enumerate(args[13:]):
            if i in relevant_paths:
                meta = tensordesc_meta[described] if tensordesc_meta else None
                final_args.extend(make_tensordesc_arg(arg, meta, args[:13]))
                described += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)

    return inner


def make_tensordesc_arg_from_3_8(arg, metadata, _):
    shape, strides = list(arg.base.shape), list(arg.base.stride())
    if metadata is None:
        return [arg.base, *shape, *strides, False, False, *shape, *strides]
    return [("map", arg.base.data_ptr(), metadata), *shape, *strides]


class CudaLauncher:
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, metadata: str | None, triton: str):
        self.launches = 0
        if triton == "3.6":
            self.launch = wrap_handle_tensordesc(self._count, {1}, [metadata])
        else:
            meta = [metadata] if metadata else None
            self.launch = wrap_handle_tensordesc_impl(self._count, {1: {}}, meta, make_tensordesc_arg_from_3_8)

    def _count(self, *flat) -> None:
        self.launches += 1

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None, *args)


@dataclass
class Source:
    signature: dict


@dataclass
class Metadata:
    num_warps: int = 4
    num_ctas: int = 1
    shared: int = 1024


class Compiled:
    """What the JIT returns: the kernel (`function`), its signature, metadata and launcher."""

    function = 1234
    packed_metadata = "metadata"
    src = Source({"x": "*fp32", "desc": "tensordesc<fp32[2]>", "scratch": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    metadata = Metadata()

    def __init__(self, metadata: str | None, triton: str = "3.6"):
        self.run = CudaLauncher(metadata, triton)


class Kernel:
    """A stand-in for a JIT function of parameters (x, desc, scratch, n, BLOCK=16): every launch goes through the
    launcher (`launches` counts them)."""

    def __init__(self, metadata: str | None = "meta", triton: str = "3.6"):
        self.compiled = Compiled(metadata, triton)

        def fn(x, desc, scratch, n, BLOCK=16):
            pass

        self.fn = fn

    @property
    def launches(self) -> int:
        return self.compiled.run.launches

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.compiled.run(*(*grid, 1)[:3], "caller-stream", self.compiled.function, *args, kwargs.get("BLOCK", 16))
            return self.compiled

        return jit

    def warmup(self, *args, grid, **kwargs):
        """The compiled kernel for these arguments, not launched."""
        return self.compiled


class Stream:
    cuda_stream = "caller-stream"


class FakeReplayModule:
    """A stand-in for the compiled replay.c: logs what the program is built of and replays."""

    def __init__(self):
        self.calls: list = []
        self.matches = True  # what replay answers: whether the call's tensors are laid out as the recorded ones

    def new(self, tensors):
        self.calls.append(("new", tensors))
        return "program"

    def launch(self, program, function, grid, num_warps, num_ctas, shared, stream, pdl, cooperative, params, *patches):
        self.calls.append(("launch", function, params))

    def replay(self, program, tensors):
        self.calls.append(("replay", tensors))
        return self.matches


@pytest.fixture
def fake_replay(monkeypatch) -> tuple[object, FakeReplayModule]:
    """The loaded launch module's native replay built by a FakeReplayModule: (launch module, the fake)."""
    launch, module = launch_module(), FakeReplayModule()
    monkeypatch.setattr(native_module(launch), "_compiled_module", lambda: module)
    return launch, module


def call(program, kernel, x: torch.Tensor, scratch: torch.Tensor, descriptor: Descriptor, tensors) -> None:
    program.begin(tensors)
    descriptor.base = tensors[1]
    program.launch(kernel, (4, 2), None, Stream(), x, descriptor, scratch, 7, BLOCK=32)
    program.end()


@pytest.mark.parametrize("triton", ["3.6", "3.8"])
def test_native_launch_lays_out_the_kernels_parameters(fake_replay, triton: str) -> None:
    """The native replay's description of a launch (native.py): the kernel's parameters in Triton's layout, a
    descriptor expanded into its map, shape and strides, constexprs left out, the two scratch pointers appended, and
    the call's tensors marked where their addresses go; the recording call issues nothing, and the calls replay
    through the C program alone."""
    launch, module = fake_replay
    kernel, scratch = Kernel(triton=triton), torch.zeros(8)
    first = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    call(program, kernel, first[0], scratch, Descriptor(first[1], [2]), first)
    ((kind, native),) = program.operations
    assert kind == "launch"
    assert (native.function, native.grid, native.stream) == (1234, (4, 2, 1), "caller-stream")
    assert (native.num_warps, native.num_ctas, native.shared_memory, native.pdl, native.cooperative) == (4, 1, 1024, True, False)
    assert native.params == [
        (8, first[0].data_ptr()), (128, ("map", first[1].data_ptr(), "meta")), (4, 6), (8, 1), (8, scratch.data_ptr()),
        (4, 7), (8, 0), (8, 0),
    ]  # fmt: skip
    assert native.pointers == [(0, 0)] and native.maps == [(1, 1)]
    assert program.native is not None and module.calls == [
        ("new", [native_module(launch).layout(t) for t in first]),
        ("launch", native.function, native.params),
    ]
    assert kernel.launches == 0  # described, not issued
    later = [torch.full((4,), 2.0), torch.full((6,), 3.0)]
    assert program.native(later) is True
    assert module.calls[-1] == ("replay", later) and kernel.launches == 0  # replayed by the C program alone
    module.matches = False
    assert program.native(later) is False  # solution.backward then runs the launcher's code


@pytest.mark.parametrize("triton", ["3.6", "3.8"])
def test_a_descriptor_not_lowered_to_tma_is_passed_as_its_base_pointer(fake_replay, triton: str) -> None:
    """Triton hands a descriptor that its compiler did not lower to TMA as the base pointer, shape and strides (i64),
    its flags (i1: padding; from 3.7 TF32 rounding too), then shape (i32) and strides (i64): the base is a call tensor's
    address to put in."""
    launch, _ = fake_replay
    kernel, scratch = Kernel(metadata=None, triton=triton), torch.zeros(8)
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    ((_, native),) = program.operations
    flags = [(1, 0)] * (1 if triton == "3.6" else 2)
    assert native.params == [
        (8, tensors[0].data_ptr()), (8, tensors[1].data_ptr()), (8, 6), (8, 1), *flags, (4, 6), (8, 1),
        (8, scratch.data_ptr()), (4, 7), (8, 0), (8, 0),
    ]  # fmt: skip
    assert native.pointers == [(0, 0), (1, 1)] and native.maps == []


def test_a_view_of_a_calls_tensor_leaves_the_program_unrecorded(fake_replay) -> None:
    launch, _ = fake_replay
    tensors = [torch.ones(4), torch.ones(6)]
    for view in ([tensors[0][1:], Descriptor(tensors[1], [2])], [tensors[0], Descriptor(tensors[1][2:], [2])]):
        program, kernel = launch.CallProgram(), Kernel()
        program.begin(tensors)
        program.launch(kernel, (1,), None, Stream(), *view, torch.zeros(2), 1)
        program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), torch.zeros(2), 1)
        program.end()
        # neither launch described nor issued (the caller runs the launcher's code again)
        assert program.native is None and program.operations == [] and kernel.launches == 0


@pytest.mark.parametrize(
    ("paths", "message"),
    [(None, "not the CUDA launcher of Triton 3.6 to 3.9"), ({1: {0: {}}}, "a tensor descriptor inside a tuple")],
)
def test_a_launcher_the_native_replay_cannot_read_leaves_the_calls_to_it(fake_replay, paths, message: str) -> None:
    """A launcher's closure of another shape (another Triton), or descriptors nested in tuple parameters: the shape's
    calls go through the launcher's code, as they would without replay.c."""
    launch, module = fake_replay
    kernel, scratch = Kernel(triton="3.8"), torch.zeros(8)
    run = kernel.compiled.run
    run.launch = (lambda *args: run._count()) if paths is None else wrap_handle_tensordesc_impl(
        run._count, paths, ["meta"], make_tensordesc_arg_from_3_8)  # fmt: skip
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    with pytest.warns(UserWarning, match=f"every call of this shape from Python: {message}"):
        call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert program.native is None and module.calls == [] and kernel.launches == 0


def test_a_launch_the_native_replay_cannot_write_leaves_the_calls_to_the_launchers_code(fake_replay) -> None:
    launch, module = fake_replay
    kernel, scratch = Kernel(), torch.zeros(8)
    kernel.compiled.run.global_scratch_size = 64  # scratch allocated per launch: not recordable as bytes
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    with pytest.warns(UserWarning, match="every call of this shape from Python: the kernel needs scratch memory"):
        call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert program.native is None and program.operations == [] and module.calls == []
    assert kernel.launches == 0  # the recording call issued nothing: the caller runs the launcher's code again
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert kernel.launches == 1 and program.operations == []  # issued through the JIT, not recorded


def test_launches_outside_a_call_are_not_kept(fake_replay) -> None:
    """A context's kernels launched outside begin and end (a test or a sweep driving one stage) are not recorded:
    nothing accumulates, and the first call still records."""
    launch, _ = fake_replay
    kernel, scratch = Kernel(), torch.zeros(8)
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    for _ in range(3):
        program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), scratch, 1)
    assert program.operations == [] and program.native is None
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)
    assert len(program.operations) == 1 and program.native is not None


def test_a_call_that_raised_leaves_nothing_recorded(fake_replay) -> None:
    launch, _ = fake_replay
    kernel, scratch = Kernel(), torch.zeros(8)
    tensors = [torch.ones(4), torch.ones(6)]
    program = launch.CallProgram()
    program.begin(tensors)
    program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), scratch, 1)
    program.end(completed=False)  # the call raised here
    assert program.operations == [] and program.native is None and program.records_next_call
    program.launch(kernel, (1,), None, Stream(), tensors[0], Descriptor(tensors[1], [2]), scratch, 1)
    assert kernel.launches == 1 and program.operations == []  # outside a call: issued, not kept
    call(program, kernel, tensors[0], scratch, Descriptor(tensors[1], [2]), tensors)  # the next call records afresh
    assert len(program.operations) == 1 and program.native is not None


@pytest.fixture(scope="module")
def replay_on_fake_driver(tmp_path_factory):
    """replay.c built with the C compiler against the cuda.h that Triton ships and linked with a stand-in for the
    driver (tests/data/fake_cuda_driver.c) into one module: its replay logic runs without a GPU. On the GPU machine
    replay.c is built by Triton's tool, and where it does not build only speed is lost (every call runs the launcher's
    code, with a warning), so a C error must fail here. (module, the stand-in driver through ctypes)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    cuda_include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    python_include = Path(sysconfig.get_paths()["include"])
    if compiler is None or not (cuda_include / "cuda.h").exists() or not (python_include / "Python.h").exists():
        pytest.skip("needs a C compiler, Triton's cuda.h and Python's headers")
    built = tmp_path_factory.mktemp("replay") / f"triton_fused_replay{sysconfig.get_config_var('EXT_SUFFIX')}"
    sources = [get_solution("triton_fused").folder / "replay.c", Path(__file__).parent / "data" / "fake_cuda_driver.c"]
    command = [compiler, "-shared", "-fPIC", "-Wall", "-Werror", f"-I{cuda_include}", f"-I{python_include}",
               *map(str, sources), "-o", str(built)]  # fmt: skip
    compiled = subprocess.run(command, check=False, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    spec = importlib.util.spec_from_file_location("triton_fused_replay", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    driver = ctypes.PyDLL(str(built))  # the same loaded object: the module's log and settings
    driver.fake_log.restype = ctypes.c_char_p
    driver.fake_tensor_map.restype, driver.fake_tensor_map.argtypes = ctypes.py_object, [ctypes.c_ulonglong]
    return module, driver


@dataclass
class Tensor:
    """A stand-in for a call's tensor: what replay.c reads of one (a 4 x 6 bf16 matrix at `address` by default)."""

    address: int
    dtype: torch.dtype = torch.bfloat16
    shape: tuple[int, ...] = (4, 6)
    strides: tuple[int, ...] = (6, 1)

    def data_ptr(self) -> int:
        return self.address

    def stride(self) -> tuple[int, ...]:
        return self.strides


def recorded_layouts(alignments=(0, 0)) -> list[tuple]:
    """The layouts of the recorded call's two tensors: 4 x 6 bf16 matrices at addresses of these remainders mod 16."""
    return [(torch.bfloat16, (4, 6), (6, 1), alignment) for alignment in alignments]


# The stand-in kernel's parameters: a call tensor's address, a TMA descriptor over another, an i32, a scratch address
# and Triton's two scratch pointers.
SIZES = [8, 128, 4, 8, 8, 8]
PDL, CLUSTER, CLUSTER_POLICY = 6, 4, 5  # CUlaunchAttributeID


def fake_program(module, driver, launches: int, alignments=(0, 0)):
    """A program of `launches` launches of kernel 1, each followed by an event record and a stream wait; the first in
    a cluster of two, every other one a programmatic dependent."""
    driver.fake_set_params(1, len(SIZES), (ctypes.c_size_t * len(SIZES))(*SIZES))
    driver.fake_fail_kernel(-1)
    driver.fake_clear_log()
    program = module.new(recorded_layouts(alignments))
    for i in range(launches):
        params = [(8, 0x1000), (128, driver.fake_tensor_map(0x2000)), (4, i), (8, 0x3000), (8, 0), (8, 0)]
        module.launch(program, 1, (4, 2, 1), 4, 2 if i == 0 else 1, 1024, 7, i % 2 == 0, False, params, [(0, 0)], [(1, 1)])
        module.record(program, 100 + i, 7)
        module.wait(program, 9, 100 + i)
    return program


def test_replay_c_writes_each_calls_addresses_and_keeps_the_rest(replay_on_fake_driver) -> None:
    """Every operation in order, each launch with the call's addresses in its pointer and its descriptor and the
    recorded configuration, attributes and other parameters, on every call; past the 16 operations after which the
    program's array of them moves (a launch's attributes must not point into the old one)."""
    module, driver = replay_on_fake_driver
    program = fake_program(module, driver, launches=20)
    for tensors in ([0x5000, 0x6000], [0x7100, 0x8200]):
        driver.fake_clear_log()
        assert module.replay(program, [Tensor(a) for a in tensors]) is True
        expected = []
        for i in range(20):
            attributes = [PDL] * (i % 2 == 0) + [CLUSTER, CLUSTER_POLICY] * (i == 0)
            expected += [
                f"launch 1 grid {8 if i == 0 else 4} 2 1 block 128 shared 1024 stream 7 attributes"
                + "".join(f" {a}" for a in attributes) + f" params {tensors[0]:x} {tensors[1]:x} {i:x} 3000 0 0",
                f"record {100 + i} on 7",
                f"wait 9 for {100 + i}",
            ]  # fmt: skip
        assert driver.fake_log().decode().splitlines() == expected


@pytest.mark.parametrize(
    ("sizes", "message"),
    [([8, 128, 8, 8, 8, 8], "parameter 2 has 4 bytes in the kernel, not 8"), (SIZES[:-1], "more than the 5 parameters")],
)
def test_replay_c_refuses_parameters_that_do_not_match_the_kernel(replay_on_fake_driver, sizes, message) -> None:
    module, driver = replay_on_fake_driver
    fake_program(module, driver, launches=0)
    program = module.new(recorded_layouts())
    params = [(size, driver.fake_tensor_map(0x2000) if size == 128 else 0) for size in sizes]
    with pytest.raises(ValueError, match=message):
        module.launch(program, 1, (1, 1, 1), 4, 1, 0, 7, False, False, params, [], [])


@pytest.mark.parametrize(
    "tensors",
    [
        [Tensor(0x5000)],
        [Tensor(0x5000), Tensor(0x6000), Tensor(0x7000)],
        [Tensor(0x5000), Tensor(0x6000, dtype=torch.float16)],
        [Tensor(0x5000), Tensor(0x6000, shape=(6, 4), strides=(4, 1))],
        [Tensor(0x5000), Tensor(0x6000, shape=(24,), strides=(1,))],
        [Tensor(0x5000), Tensor(0x6000, strides=(1, 4))],
        [Tensor(0x5008), Tensor(0x6000)],
    ],
    ids=["fewer", "more", "dtype", "shape", "dimensions", "strides", "alignment"],
)
def test_replay_c_issues_nothing_for_tensors_laid_out_otherwise(replay_on_fake_driver, tensors) -> None:
    """The kernels were specialised on the recorded call's tensors: a call whose tensors differ in number, dtype,
    shape, strides or alignment gets False and nothing issued (solution.backward then takes its own context)."""
    module, driver = replay_on_fake_driver
    program = fake_program(module, driver, launches=2)
    driver.fake_clear_log()
    assert module.replay(program, tensors) is False
    assert driver.fake_log().decode() == ""
    assert module.replay(program, [Tensor(0x5000), Tensor(0x6000)]) is True
    assert driver.fake_log().decode().count("launch") == 2


def test_replay_c_errors_name_the_problem(replay_on_fake_driver) -> None:
    module, driver = replay_on_fake_driver
    with pytest.raises(ValueError, match="tensor 0 has 2 sizes and 1 strides"):
        module.new([(torch.bfloat16, (4, 6), (1,), 0)])
    with pytest.raises(ValueError, match="a tensor of 9 dimensions"):
        module.new([(torch.bfloat16, (1,) * 9, (1,) * 9, 0)])
    program = fake_program(module, driver, launches=2, alignments=(0, 8))
    with pytest.raises(TypeError, match="must be Triton's CUtensorMap"):
        module.launch(program, 1, (1, 1, 1), 4, 1, 0, 7, False, False, [(8, 0), (128, 0), (4, 0), (8, 0), (8, 0), (8, 0)],
                      [], [])  # fmt: skip
    with pytest.raises(RuntimeError, match="operation 0 of the replay: cuTensorMapReplaceAddress failed"):
        module.replay(program, [Tensor(0x5000), Tensor(0x6008)])  # a descriptor's base must be 16-byte aligned
    program = fake_program(module, driver, launches=2)
    driver.fake_fail_kernel(1)
    with pytest.raises(RuntimeError, match="operation 0 of the replay: cuLaunchKernelEx failed: fake failure"):
        module.replay(program, [Tensor(0x5000), Tensor(0x6000)])


def test_the_installed_tritons_launcher_is_read_exactly_or_declined() -> None:
    """native.py against the wrapper that the Triton installed here builds for a kernel with a tensor descriptor not
    lowered to TMA (no GPU needed): the replay's parameters are, value for value, what that wrapper hands the C entry
    point, or the replay declines (Unsupported), so that the calls go through Triton's launcher; never another error,
    which would fail the solution's call."""
    native = native_module(launch_module())
    handed: list = []
    signature = {"x": "*fp32", "desc": "tensordesc<fp32[2, 2]>", "n": "i32"}
    wrapper = nvidia_driver.wrap_handle_tensordesc(lambda *args: handed.append(args), signature, [])
    run = SimpleNamespace(launch=wrapper, global_scratch_size=0, profile_scratch_size=0, launch_pdl=False,
                          launch_cooperative_grid=False)  # fmt: skip
    compiled = Compiled(None)  # the stand-in, with the installed Triton's wrapper and this signature
    compiled.run, compiled.src = run, Source(signature)
    x, base = torch.ones(4), torch.ones(4, 4)
    values = [x, TensorDescriptor.from_tensor(base, [2, 2]), 7]
    try:
        described = native.describe_launch(compiled, (1, 1, 1), 0, values, [x, base])
    except native.Unsupported:
        return  # declined cleanly (a Triton whose wrapper native.py does not read): no other error escaped
    # the launch's own arguments (grid, stream, kernel, ...), then the kernel's: spread in 3.6, one list from 3.7
    own = getattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", None)
    if own is not None:
        wrapper(*[None] * own, *values)
    else:
        wrapper(None, values)
    (entry_point_args,) = handed
    kernel_args = entry_point_args[own:] if own is not None else entry_point_args[-1]
    expected = [v.data_ptr() if isinstance(v, torch.Tensor) else int(v) for v in kernel_args]
    assert [value for _, value in described.params[: -native.SCRATCH_POINTERS]] == expected
    assert described.pointers == [(0, 0), (1, 1)]
