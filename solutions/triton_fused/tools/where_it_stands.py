"""docs/performance.md's "Where it stands" from the committed result files: triton_fused per public workload beside
the best peer's time, and the means and speed-up ranges the log's prose quotes. No GPU; run it after a new run's files
are committed, and paste its output over the log's (tests/test_triton_fused.py holds the log to it).

    PYTHONPATH=. python3 solutions/triton_fused/tools/where_it_stands.py [--device nvidia-h200]

The peers are the solutions that passed every workload, but for the float32 reference: a workload's best peer is the
fastest of them there, by each timing on its own (device time, call latency, mixed T, sustained).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from harness.compare import load_frame
from harness.status import Status

OURS, BASELINE = "triton_fused", "reference_fp32"
SHORT_NAMES = {"torch_compile_max_autotune": "max-autotune", "quack_dgated": "QuACK", "torch_cublas": "cuBLAS"}
# (the frame's column, the log's name for it) of the timings set against the best peer's
TIMINGS = (("device_us", "device time"), ("latency_us", "call latency"), ("mixed_us", "mixed T"), ("sustained_us", "sustained"))
COLUMNS = ("B", "T", "SOL us", "device time", "call latency", "mixed T", "sustained", "latency / device", "host",
           "launch floor", "public evaluator", "best peer device time", "best peer call latency", "best peer mixed T",
           "speed-up device / latency / mixed")  # fmt: skip


def _number(value: float, thousands: bool = False) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.1f}" if thousands else f"{value:.1f}"


def _best_peer(rows: pd.DataFrame, column: str) -> tuple[float, str]:
    """The fastest peer's value in one workload's rows (one per peer), and its short name."""
    timed = rows.dropna(subset=[column])
    if timed.empty:
        return math.nan, "none timed"
    fastest = timed.loc[timed[column].idxmin()]
    return fastest[column], SHORT_NAMES.get(fastest.solution, fastest.solution)


def where_it_stands(results_dir: Path, device: str) -> str:
    """The log's means sentence, its per-workload table and its speed-up sentence, as markdown."""
    frame = load_frame(results_dir, device=device)
    passed = frame.groupby("solution").status.agg(lambda s: (s == Status.PASSED.value).all())
    peers = frame[frame.solution.isin([s for s, ok in passed.items() if ok and s not in (OURS, BASELINE)])]
    ours = frame[frame.solution == OURS].sort_values(["T", "B"])
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    speedups: dict[str, list[float]] = {column: [] for column, _ in TIMINGS}
    for w in ours.itertuples():
        rows = peers[peers.uuid == w.uuid]
        best = {column: _best_peer(rows, column) for column, _ in TIMINGS}
        for column, _ in TIMINGS:
            speedups[column].append(best[column][0] / getattr(w, column))
        cells = [str(w.B), str(w.T), _number(w.sol_us), *(_number(getattr(w, c)) for c, _ in TIMINGS),
                 f"{w.latency_us / w.device_us:.2f}", f"{w.host_us:.0f}", _number(w.floor_us), _number(w.public_us),
                 *(f"{_number(best[c][0])} ({best[c][1]})" for c, _ in TIMINGS[:3]),
                 " / ".join(f"{speedups[c][-1]:.2f}" for c, _ in TIMINGS[:3])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    means = [f"{_number(ours[column].mean())} {name.removesuffix(' time')}" for column, name in TIMINGS]
    public = f", public evaluator {_number(ours.public_us.mean())}" if ours.public_us.notna().all() else ""
    peer_means = [min((group[column].mean(), SHORT_NAMES.get(s, s)) for s, group in peers.groupby("solution"))
                  for column, _ in TIMINGS]  # fmt: skip
    named = []  # a peer's name follows the last of a run of its means: "625.0 (max-autotune), 1,004.5, ... (torch_compile)"
    for i, (value, name) in enumerate(peer_means):
        last_of_run = i + 1 == len(peer_means) or peer_means[i + 1][1] != name
        named.append(_number(value, thousands=True) + (f" ({name})" if last_of_run else ""))
    sentence = (f"Means: {', '.join(means)}{public}, host {_number(ours.host_us.mean())} per call; the best peers' "
                f"{', '.join(named[:-1])} and {named[-1]}.")  # fmt: skip
    ranges = ", ".join(f"{min(speedups[c]):.2f}-{max(speedups[c]):.2f}x {name}" for c, name in TIMINGS)
    lead = "leads every peer on every workload" if all(min(v) > 1 for v in speedups.values()) else "against the best peer"
    return "\n".join([sentence, "", *lines, "", f"{OURS} {lead}: {ranges}."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parents[3] / "results")
    parser.add_argument("--device", default="nvidia-h200")
    args = parser.parse_args()
    print(where_it_stands(args.results_dir, args.device))


if __name__ == "__main__":
    main()
