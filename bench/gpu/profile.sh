#!/usr/bin/env bash
# Where a step's device time goes, for the shapes named (default: lra), on a lent GPU, after
# bench/gpu/run.sh unpacked /tmp/fpt-cuda. fpt's step: Nsight Compute (ncu, clocks left
# alone) times every kernel of one warm-up and one timed step (the matmul-peak products
# `fpt bench` runs around them are in the list too); PyTorch's: torch.profiler over one
# step. Writes $OUT/profile-<shape>-{ncu.csv,fpt.txt,pytorch.txt}.
#   bash bench/gpu/profile.sh lra listops
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
py="${FPT_PYTHON:-python3}"
bin=/tmp/fpt-cuda
[ -x "$bin" ] || { echo "no $bin: run bench/gpu/run.sh first" >&2; exit 2; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
for shape in "${@:-lra}"; do
    echo "== profile $shape"
    if [ -n "$ncu" ]; then
        timeout "${FPT_PROFILE_TIMEOUT:-120}" "$ncu" --clock-control none --metrics gpu__time_duration.sum \
            --csv --log-file "$OUT/profile-$shape-ncu.csv" \
            "$bin" bench --shape "$shape" --warmup 1 --steps 1 --no-full --device cuda:0 > /dev/null 2>&1
        echo "ncu exited $?"
        "$py" bench/gpu/ncu_summary.py "$OUT/profile-$shape-ncu.csv" --top 25 | tee "$OUT/profile-$shape-fpt.txt"
    else
        echo "no ncu on this machine"
    fi
    timeout 90 "$py" bench/pytorch_fpt_step.py --fpt "$bin" --shape "$shape" --steps 2 --warmup 2 --no-full \
        --device cuda:0 --profile "$OUT/profile-$shape-pytorch.txt" > /dev/null
    head -40 "$OUT/profile-$shape-pytorch.txt" 2>/dev/null | cut -c1-200
done
