#!/usr/bin/env bash
# One device call on the H200 (the library's `device` tool): calibration and one side-by-side bench of the given
# solutions on the public suite, the mixed-T and sustained timings included, as the committed run. The log and a
# tarball of results/ come back in $OUT. The GPU tests take more than six minutes of a call's 600 s (on an H100), so
# they run in a call of their own: source scripts/h200_env.sh; python3 -m pytest -q -m gpu tests
# Usage (repo root, on the GPU machine):
#   [EXPECT_GPU=H200] [KEEP_CALIBRATION=1] [EVALUATOR=DIR] [STEP=1] bash scripts/h200_session.sh SOLUTION[,SOLUTION...]
# A solution whose code changed joins the committed run again with all three: no calibration (the bench scores against
# the committed calibration and baseline), NVIDIA's evaluator from its checkout at DIR with the wheels in .whl
# (scripts/public_evaluator.sh) after the bench, then the step suite. The tarball is packed again after each stage, so
# a call cut short by its time limit still brings back what finished.
set -uo pipefail
# The copied tree's .git, if any, names another commit than the one copied: the commit comes from the caller,
# expanded where the checkout is. A value equal to this copy's HEAD with the tree differing from it was expanded
# here, and would name the wrong commit in every result file.
if [ -z "${HARNESS_GIT_COMMIT:-}" ]; then
    echo "set HARNESS_GIT_COMMIT to your checkout's commit (git rev-parse HEAD, run where the checkout is)" >&2
    exit 2
fi
if [ "$HARNESS_GIT_COMMIT" = "$(git rev-parse HEAD 2>/dev/null)" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    echo "HARNESS_GIT_COMMIT is this copy's .git HEAD, but the tree differs from it: expand it where your checkout is" >&2
    exit 2
fi
# A request for an H200 may be answered by another GPU: with EXPECT_GPU (a part of nvidia-smi's name, e.g. H200) the
# call stops before any work there, so that it costs only the machine's start.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -n "${EXPECT_GPU:-}" ] && [[ "$gpu" != *"$EXPECT_GPU"* ]]; then
    echo "this machine's GPU is $gpu, not $EXPECT_GPU: nothing run" >&2
    exit 3
fi
source scripts/h200_env.sh
log="$OUT/session.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$log"
[ "${KEEP_CALIBRATION:-0}" = 1 ] || python3 -m harness calibrate 2>&1 | tee -a "$log"
start=$(date +%s)
python3 -m harness bench --mixed-tokens --sustained --solution "$1" 2>&1 | tee -a "$log"
echo "side-by-side bench of $1: $(( $(date +%s) - start )) s wall" | tee -a "$log"
tar -cf "$OUT/results.tar" results
if [ -n "${EVALUATOR:-}" ]; then
    bash scripts/public_evaluator.sh "$EVALUATOR" .whl /tmp/public "$1" 2>&1 | tee -a "$log"
    tar -cf "$OUT/results.tar" results
fi
if [ "${STEP:-0}" = 1 ]; then
    python3 -m harness bench --suite step --mixed-tokens --sustained --solution "$1" 2>&1 | tee -a "$log"
    tar -cf "$OUT/results.tar" results
fi
echo "all done: $(( $(date +%s) - start )) s wall" | tee -a "$log"
python3 -m harness compare 2>&1 | tee -a "$log"
