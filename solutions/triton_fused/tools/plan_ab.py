"""Same-process A/B of triton_fused's whole backward: each workload's bucket plan against variants of it. GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/plan_ab.py --workloads 6,3 --reps 3 --out ab.jsonl \
        --variant 'zeros behind grad_w2: replace(plan, schedule=replace(plan.schedule, zeros_at="after_grad_w2"))'

--suite edges takes the workloads of workloads/edges.yaml instead (both sides of every T bucket). --against ROOT times
another checkout's triton_fused (a commit's `git archive` unpacked at ROOT, say) beside this one's, in this process, as
the variant 'against' with its own bucket plan: a change no plan expresses (launcher code, a kernel's body) compared
without two processes, whose hosts can differ by tens of microseconds per call (docs/performance.md, v65). Repeated, it
times several trees in the one process, each as 'against:NAME' by its root's folder name, in the same rounds as the
plan and one settle. A tree's own side stream moved its device time by more than the changes this compares
(docs/performance.md, v66), so the other trees' calls run on this tree's side stream and intermediate buffers
(share_stream_state), where they keep them as this one does.

A variant is `name: expression`, a Python expression that gives a Plan, over `plan` (the workload's bucket plan), `T`
and `B` (the workload's tokens and rows), `replace` (dataclasses.replace) and the names of the solution's plan.py, as in
`gluon grad_w2: replace(plan, grad_w2=GluonWeightGrad(dynamic=True))` or, one variant over several buckets,
`fewer stages: replace(plan, dx=replace(plan.dx, stages=2 if T <= 160 else 3))`.
One module and one input set per workload: the plans differ only in what the variant changes, so differences of a few us
between machines or processes do not enter. Each variant's outputs are compared with the plan's first (the largest
difference relative to the largest magnitude, per output; a placement of stages must give 0). Then, after --settle
seconds of the plans timed in turn with the times discarded, every plan is timed REPS times, in alternating order, by
the harness's CUDA-event timer (L2 flushed before each call, a GPU spin ahead of each batch, so the host's launch time
stays outside the events; the input set drawn once), with --redraw by the same timer amid the work `harness bench` does
around each call (the inputs redrawn before it, the outputs scanned after it: that work slows some calls,
docs/performance.md v72), with --latency by its call-latency timer (the device idle at each call's start, every call's
tensors copied to addresses of their own, as `harness bench` times the headline), or with --sustained by its
back-to-back timer (no pause between calls, the GPU at the clock its power limit allows, as in a training step); the
printout gives each variant's difference from the plan round by round (`summary`). Each invocation appends a provenance
header and then its rows to --out (JSON lines), so several invocations can share one file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import itertools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from harness.provenance import collect, read_clocks
from harness.registry import SOLUTIONS_DIR, get_solution
from harness.reward_hacks import TimedOutputChecks
from harness.runner import SUSTAINED_SETTLE_S, allocate_outputs, redraw_in_place
from harness.timing import FreshAddresses, TimingConfig, time_call_latency, time_device, time_sustained
from harness.workloads import Workload, load_named_suite
from reference import generate_inputs
from reference.problem import INPUTS, OUTPUTS, Dims

TIMING = TimingConfig(min_calls=20, max_calls=60, target_rel_stderr=0.005, max_seconds=2.0)
# Seconds of the plans timed with the times discarded before a workload's first round (the settle): rounds timed
# before the GPU's clock settles where the timer holds it favour the plan timed first, or the one timed second
# (docs/performance.md, "Tried").
SETTLE_SECONDS = 3.0
AGAINST = "against"  # the variant name of --against's tree (with several: AGAINST:NAME, against_names)
WARMUP_CALLS = 3  # calls of a plan before the profiling tools profile it: its compiles, its call context's recording


def gpu_time_us(fn, config: TimingConfig = TIMING) -> float:
    """Mean of the harness's CUDA-event timer over calls of fn on one input set."""
    return time_device(lambda _: fn(), lambda _: None, 1, torch.device("cuda"), config).mean_us


def redrawn_time_us(
    backward, arguments: list[torch.Tensor], dims: Dims, seeds: Iterator[int], config: TimingConfig = TIMING
) -> float:
    """Mean of the CUDA-event timer over calls of backward(*arguments) amid the work `harness bench` does around each
    timed call: the inputs redrawn in place from the next seed and the outputs poisoned before it, the outputs scanned
    for NaN (and a sample kept) after it. That work slows some calls after it (docs/performance.md, v72)."""
    inputs = dict(zip((spec.name for spec in INPUTS), arguments[: len(INPUTS)]))
    outputs = arguments[len(INPUTS) :]
    checks = TimedOutputChecks()

    def prepare(_: int) -> None:
        checks.current = redraw_in_place(inputs, outputs, dims, next(seeds))
        checks.current.outputs = list(outputs)  # backward writes into them

    return time_device(lambda _: backward(*arguments), prepare, 1, arguments[0].device, config, checks.after).mean_us


def sustained_us(fn, device: str = "cuda", config: TimingConfig = TIMING) -> float:
    """Mean time per call of fn by the harness's back-to-back timer (no pause between calls), after SUSTAINED_SETTLE_S
    seconds of its untimed calls."""
    return time_sustained(lambda _: fn(), lambda _: None, 1, torch.device(device), config, SUSTAINED_SETTLE_S).timing.mean_us


def latency_and_host_us(backward, tensors: list[torch.Tensor], config: TimingConfig = TIMING) -> tuple[float, float]:
    """Mean call latency of backward(*tensors) by the harness's timer, each call on an idle device with copies of
    `tensors` at addresses no earlier call used (made outside the timed window), and the mean host time of issuing
    those calls: a variant whose latency moves against its device time shows there whether the host is why."""
    fresh = FreshAddresses(tensors, config.most_calls)
    views: list[torch.Tensor] = []

    def prepare(i: int) -> None:
        views[:] = fresh.at(i)
        for view, tensor in zip(views, tensors):
            view.copy_(tensor)

    latency, host = time_call_latency(lambda _: backward(*views), prepare, tensors[0].device, config)
    return latency.mean_us, host.mean_us


def parse_variant(text: str) -> tuple[str, str]:
    """'name: expression' -> (name, expression)."""
    name, _, expression = text.partition(":")
    if not expression.strip():
        raise SystemExit(f"variant {text!r}: expected 'name: expression'")
    return name.strip(), expression.strip()


def variant_plans(module, dims, variants: dict[str, str]) -> dict:
    """{"plan": the plan of the workload's bucket} and each variant's plan by name: its expression evaluated over `plan`
    (the bucket's), `T` and `B` (the workload's), `replace` and the names of the solution module's plan.py (that
    module's own: another tree's solution shares its package's name)."""
    bucket = module.plan_for(dims.num_tokens)
    names = plan_module_names(module) | {
        "replace": dataclasses.replace,
        "plan": bucket,
        "T": dims.num_tokens,
        "B": dims.batch_seq_len,
    }
    plans = {"plan": bucket}
    for name, expression in variants.items():
        try:
            plans[name] = eval(expression, dict(names))  # the expression is the developer's own command line
        except Exception as exc:  # noqa: BLE001 - any fault of the expression is reported as the variant's
            raise SystemExit(f"variant {name!r}: {type(exc).__name__}: {exc}") from None
    return plans


def plan_module_names(module) -> dict[str, Any]:
    """The names of a loaded solution module's plan.py, found through its plan_for rather than by the package's name."""
    return inspect.unwrap(module.plan_for).__globals__


def solution_module(solutions: Path = SOLUTIONS_DIR) -> Any:
    """triton_fused's solution module from the folder `solutions`, loaded as the harness loads a solution: a package of
    a fixed name, which a later load replaces in sys.modules while the modules loaded before keep working."""
    run = get_solution("triton_fused", solutions).load_entry_point()
    return sys.modules[run.__module__]


def against_names(roots: list[str]) -> list[str]:
    """The variant names of --against's trees, in order: AGAINST for one tree, AGAINST:NAME by each root's folder name
    for several (two folders of one name are refused: their rows could not be told apart)."""
    if len(roots) == 1:
        return [AGAINST]
    names = [f"{AGAINST}:{Path(root).resolve().name}" for root in roots]
    if len(set(names)) != len(names):
        raise SystemExit(f"--against {' '.join(roots)}: two roots of one folder name; name their folders apart")
    return names


def load_other_tree(root: str) -> Any:
    """triton_fused's solution module from another checkout of the repository at `root` (solution_module), to be timed
    beside this tree's, which main loads after it."""
    folder = Path(root) / "solutions"
    if not (folder / "triton_fused").is_dir():
        raise SystemExit(f"--against {root}: no solutions/triton_fused there")
    return solution_module(folder)


def share_stream_state(other: Any, module: Any) -> bool:
    """Point the other tree's side streams and per-stream intermediate buffers at this tree's (solution._SIDE_STREAMS
    and _STREAM_SCRATCH, from 018914e): calls on one stream are ordered, so contexts of both trees can share them as
    contexts of one tree's plans do. False where the other tree keeps them otherwise (its own then run its calls)."""
    names = ("_SIDE_STREAMS", "_STREAM_SCRATCH")
    if not all(hasattr(tree, name) for tree in (other, module) for name in names):
        return False
    for name in names:
        setattr(other, name, getattr(module, name))
    return True


def add_shared_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """The options plan_ab.py, timeline.py and ncu_call.py share: the workloads, the variants, another tree and the log
    file."""
    parser.add_argument("--suite", default="public", help="workload suite (workloads/NAME.yaml); default: public")
    parser.add_argument("--workloads", help="comma-separated indices of the suite's workloads (default: all)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'name: expression' (repeatable; none: the bucket's plan alone)",
    )
    parser.add_argument("--against", metavar="ROOT", action="append", default=[],
                        help="another checkout's root: its triton_fused, as 'against' (repeatable: 'against:NAME')")  # fmt: skip
    parser.add_argument("--out", default=out, help="JSON lines log, appended to")


@dataclasses.dataclass
class Session:
    """What one invocation of a tool works on: this tree's solution module, --against's by variant name (none without
    it), the variants by name, the chosen (index, workload) pairs and the log file."""

    module: Any
    others: dict[str, Any]
    variants: dict[str, str]
    workloads: list[tuple[int, Workload]]
    out: Path

    def plans(self, dims) -> dict[str, tuple[Any, Any]]:
        """(solution module, plan) by name: the workload's bucket plan and each variant of it (variant_plans), and with
        --against each other tree's bucket plan, under its name (against_names)."""
        plans = {name: (self.module, plan) for name, plan in variant_plans(self.module, dims, self.variants).items()}
        for name, other in self.others.items():
            plans[name] = other, other.plan_for(dims.num_tokens)
        return plans


def start_session(args: argparse.Namespace) -> Session:
    """The invocation's Session; its provenance header (and a line per --against tree) appended to the log file, which
    several invocations may share. The other trees are loaded first and run on this tree's side stream and buffers
    (share_stream_state)."""
    roots = dict(zip(against_names(args.against), args.against))
    others = {name: load_other_tree(root) for name, root in roots.items()}
    module = solution_module()
    variants = dict(parse_variant(text) for text in args.variant)
    if clash := sorted(set(others) & set(variants)):
        raise SystemExit(f"variant {clash[0]!r}: the name of an --against tree; name the variant otherwise")
    workloads = list(enumerate(load_named_suite(args.suite).workloads))
    if args.workloads:
        try:
            workloads = [workloads[int(i)] for i in args.workloads.split(",")]
        except (ValueError, IndexError):
            raise SystemExit(f"--workloads {args.workloads!r}: expected indices below {len(workloads)}") from None
    out = Path(args.out)
    device = torch.device("cuda")
    with out.open("a") as handle:
        handle.write(json.dumps(collect(device, read_clocks(device)).model_dump(mode="json")) + "\n")
    for name, other in others.items():
        shared = share_stream_state(other, module)
        if not shared:
            print(f"--against {roots[name]}: its tree keeps its side stream and buffers otherwise; differences include theirs")
        with out.open("a") as handle:
            handle.write(json.dumps({name: str(Path(roots[name]).resolve()), "shared_stream_state": shared}) + "\n")
    return Session(module, others, variants, workloads, out)


def workload_arguments(
    workloads: list[tuple[int, Workload]], seed: int, device: torch.device
) -> Iterator[tuple[int, Workload, list[torch.Tensor]]]:
    """(index, workload, arguments) per workload: a call's arguments, the inputs drawn from `seed` and then the outputs,
    unwritten; the list is emptied before the next workload's are drawn, so that one workload's tensors are on the
    device at a time."""
    for index, workload in workloads:
        inputs = generate_inputs(workload.dims, seed, device)
        arguments = [inputs[spec.name] for spec in INPUTS] + allocate_outputs(workload, device)
        del inputs
        yield index, workload, arguments
        arguments.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def warmed_variants(
    session: Session, seed: int, device: torch.device
) -> Iterator[tuple[int, Workload, list[torch.Tensor], str, Any, Any]]:
    """(index, workload, arguments, name, solution module, plan) for each of the session's plans of each workload
    (Session.plans), on that workload's arguments (workload_arguments), once the plan has made WARMUP_CALLS calls on
    them: what timeline.py and ncu_call.py profile."""
    for index, workload, arguments in workload_arguments(session.workloads, seed, device):
        for name, (solution, plan) in session.plans(workload.dims).items():
            for _ in range(WARMUP_CALLS):
                solution.backward(*arguments, plan=plan)
            yield index, workload, arguments, name, solution, plan


def summary(index: int, tokens: int, times: dict[str, list[float]], hosts: dict[str, list[float]] | None = None) -> list[str]:
    """One workload's printed timings: each plan's mean and rounds, and each variant's difference from the bucket's plan
    round by round (a round times every plan once, back to back, so its pair shares the machine's moment); with
    `hosts`, each plan's mean host time of issuing a call too."""
    lines = []
    for name, values in times.items():
        line = f"#{index} T={tokens} {name:30} mean {statistics.fmean(values):8.1f} us  ({', '.join(f'{v:.1f}' for v in values)})"
        if name != "plan":
            deltas = [value - base for value, base in zip(values, times["plan"])]
            line += f"  minus plan {statistics.fmean(deltas):+.1f} ({', '.join(f'{d:+.1f}' for d in deltas)})"
        if hosts is not None:
            line += f"  host {statistics.fmean(hosts[name]):.1f} us"
        lines.append(line)
    return lines


def time_plan(
    args: argparse.Namespace, module: Any, plan: Any, arguments: list[torch.Tensor], dims: Dims, seeds: Iterator[int]
) -> tuple[float, float | None]:
    """One plan's time on these arguments by the timer the command line chose, and with --latency its host time (us)."""
    if args.redraw:
        return redrawn_time_us(functools.partial(module.backward, plan=plan), arguments, dims, seeds), None
    if args.latency:
        return latency_and_host_us(functools.partial(module.backward, plan=plan), arguments)
    if args.sustained:
        return sustained_us(functools.partial(module.backward, *arguments, plan=plan)), None
    return gpu_time_us(functools.partial(module.backward, *arguments, plan=plan)), None


def main() -> None:
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser, "plan_ab.jsonl")
    parser.add_argument("--reps", type=int, default=3)
    timers = parser.add_mutually_exclusive_group()
    timers.add_argument("--latency", action="store_true", help="time call latency at fresh addresses, not device time")
    timers.add_argument("--sustained", action="store_true", help="time calls back to back, never pausing")
    timers.add_argument("--redraw", action="store_true",
                        help="time device time amid bench's work around each call: inputs redrawn, outputs scanned")  # fmt: skip
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                        help="seconds of discarded timings of the plans before each workload's first round")  # fmt: skip
    args = parser.parse_args()

    timer = "call_latency" if args.latency else "sustained" if args.sustained else "redrawn" if args.redraw else "device"
    session = start_session(args)
    device = torch.device("cuda")
    for index, workload, arguments in workload_arguments(session.workloads, 0, device):
        dims, outputs = workload.dims, arguments[len(INPUTS) :]
        plans = session.plans(dims)
        expected = None
        for name, (solution, plan) in plans.items():
            for out_tensor in outputs:
                out_tensor.fill_(float("nan"))
            solution.backward(*arguments, plan=plan)
            got = [out_tensor.float() for out_tensor in outputs]
            if expected is None:
                expected = got
            differences = {
                spec.name: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                for spec, a, b in zip(OUTPUTS, got, expected)
            }
            print(f"#{index} T={dims.num_tokens} {name}: largest relative difference from the plan's outputs {differences}")
        times: dict[str, list[float]] = {name: [] for name in plans}
        hosts: dict[str, list[float]] = {name: [] for name in plans}
        seeds = itertools.count(1)  # --redraw's input sets
        # The settle: the plans timed in turn by the chosen timer, the times discarded, for --settle seconds and a
        # round at least. Each timer holds the GPU at a clock of its own (calls back to back lower it under the power
        # limit, the device-time timer's pauses let it recover), and rounds timed before the clock gets there drift.
        settled = time.perf_counter() + args.settle
        while True:
            for solution, plan in plans.values():
                time_plan(args, solution, plan, arguments, dims, seeds)
            if time.perf_counter() >= settled:
                break
        with session.out.open("a") as handle:
            for rep in range(args.reps):
                for name, (solution, plan) in list(plans.items())[:: 1 if rep % 2 == 0 else -1]:
                    us, host_us = time_plan(args, solution, plan, arguments, dims, seeds)
                    times[name].append(us)
                    if host_us is not None:
                        hosts[name].append(host_us)
                    row = {
                        "index": index,
                        "B": dims.batch_seq_len,
                        "T": dims.num_tokens,
                        "variant": name,
                        "rep": rep,
                        "timer": timer,
                        "us": us,
                    } | ({"host_us": host_us} if host_us is not None else {})
                    handle.write(json.dumps(row) + "\n")
        print("\n".join(summary(index, dims.num_tokens, times, hosts if args.latency else None)))
        del outputs, got, expected  # with workload_arguments' own list, every reference to this workload's tensors


if __name__ == "__main__":
    main()
