#!/usr/bin/env bash
# Issue 5's device call: three isolated side-by-side runs of the honest solutions (no false positive may
# appear) and one in-process run, for the cost of the isolation. The GPU tests, the adversaries' among them,
# run in scripts/h200_session.sh. Compare the in-process run with isolated runs 2 and 3: run 1 also pays
# the cold Triton and inductor caches.
set -uo pipefail
source scripts/h200_env.sh
log="$OUT/isolation.log"
honest=reference_fp32,torch_eager,torch_compile,torch_cublas,triton_fused
for run in 1 2 3; do
    SECONDS=0
    python3 -m harness bench -s $honest --results-dir /tmp/isolated$run --seed $run 2>&1 | grep -E "passed [0-9]|REWARD|INVALID|TIMEOUT|ERROR" | tee -a "$log"
    echo "isolated run $run (seed $run): $SECONDS s wall" | tee -a "$log"
done
SECONDS=0
python3 -m harness bench -s $honest --no-isolation --results-dir /tmp/inprocess --seed 1 2>&1 | grep -E "passed [0-9]|REWARD|INVALID|TIMEOUT|ERROR" | tee -a "$log"
echo "in-process run (seed 1): $SECONDS s wall" | tee -a "$log"
tar -cf "$OUT/isolation.tar" /tmp/isolated1 /tmp/isolated2 /tmp/isolated3 /tmp/inprocess 2>/dev/null
