#!/usr/bin/env bash
# Run NVIDIA's public SOL-ExecBench evaluator on the GPU machine against exports of our solutions, as an external
# check of what we export and of our call latency. Nothing of the evaluator is part of this project: bring a checkout
# of https://github.com/NVIDIA/SOL-ExecBench (v1.0.2 was checked) and a folder of the wheels the machine lacks
# (pydantic with pydantic-core, annotated-types and typing-inspection; cupti-python 13.0.1, whose CUPTI timer the
# evaluator imports). It runs with its defaults: clocks unlocked, CUPTI spans, medians of 50 timed calls.
#
# Usage (repo root, on the GPU machine):
#   bash scripts/public_evaluator.sh SOL_EXECBENCH_DIR WHEEL_DIR OUT_DIR SOLUTION[,SOLUTION...]
# For each solution: OUT_DIR/<solution>/ holds the export, the evaluator's traces (public_traces.jsonl) and log; the
# traces are copied to results/<device>/public-evaluator/<solution>.jsonl with the code's hashes (<solution>.sources.json),
# where `harness compare` shows the evaluator's latency (public_us) beside the harness's timings, as it prints last, per
# workload and in all. EVALUATOR_TIMEOUT_S bounds each evaluation (default 1800).
set -uo pipefail
if [ $# -ne 4 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
evaluator=$(realpath "$1") wheels=$(realpath "$2") out=$3 solutions=$4
[ -d "$evaluator/src/sol_execbench" ] || { echo "no src/sol_execbench under $evaluator" >&2; exit 2; }
site=$(mktemp -d) bin=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
# the evaluator starts its driver as `python`: a wrapper, since a link out of a virtual environment's folder loses it
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > "$bin/python" && chmod +x "$bin/python"
slug=$(PYTHONPATH="$site:$PWD" python3 -c "import torch; from harness.provenance import device_slug; print(device_slug(torch.device('cuda')))")
mkdir -p "$out"
for name in ${solutions//,/ }; do
    folder="$out/$name"
    PYTHONPATH="$site:$PWD" python3 -m harness export -s "$name" --device "$slug" --format sol-execbench -o "$folder" || continue
    # the evaluator alone on the path: the export must run without this project
    (cd "$folder" && PATH="$bin:$PATH" PYTHONPATH="$evaluator/src:$site" \
        timeout "${EVALUATOR_TIMEOUT_S:-1800}" python3 -c "from sol_execbench.cli import cli; cli()" . --solution solution.json \
            -o public_traces.jsonl) \
        > "$folder/public.log" 2>&1
    echo "$name: the evaluator exited with $? (log: $folder/public.log)"
    # kept beside the harness's result with the hashes of the code it ran, where `harness compare` reads it as the
    # column public_us while the result is of the same code
    [ -s "$folder/public_traces.jsonl" ] && PYTHONPATH="$site:$PWD" python3 -c \
        'import sys; from pathlib import Path; from harness.compare import keep_public_traces; keep_public_traces(*map(Path, sys.argv[1:]))' \
        "$folder/public_traces.jsonl" "results/$slug/$name.json"
done
chosen=()
for name in ${solutions//,/ }; do chosen+=(-s "$name"); done
PYTHONPATH="$site:$PWD" python3 -m harness compare --device "$slug" "${chosen[@]}" --by-workload \
    --value latency_us,device_us,public_us
PYTHONPATH="$site:$PWD" python3 -m harness compare --device "$slug"
