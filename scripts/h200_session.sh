#!/usr/bin/env bash
# One device call on the H200 (the library's `device` tool): install the carried wheels, run the GPU
# tests, calibrate, and bench the given solutions on the public suite; logs and result files go to $OUT.
# Usage (from the repo root on the GPU machine): bash scripts/h200_session.sh SOLUTION [SOLUTION ...]
set -uo pipefail
source scripts/h200_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/session.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/session.log"
python3 -m pytest -q -m gpu tests 2>&1 | tail -5 | tee -a "$OUT/session.log"
python3 -m harness calibrate 2>&1 | tee -a "$OUT/session.log"
for solution in "$@"; do
    start=$(date +%s)
    python3 -m harness bench --solution "$solution" 2>&1 | tee -a "$OUT/session.log"
    echo "bench $solution: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/session.log"
done
python3 -m harness compare 2>&1 | tee -a "$OUT/session.log"
cp results/*/*.json "$OUT/" 2>/dev/null
ls "$OUT"
