#!/usr/bin/env bash
# The one command a lent GPU machine runs (from the repository root, with the CUDA build
# carried: `target/cuda/fpt-cuda.gz`, made here by `cargo xtask cuda-build`). It records the
# machine, then runs `fpt gpu-check` on every transformer shape of `fpt bench --list` but
# `tiny` (and the LSTM shapes), in f32 beside PyTorch's f32 step and in bf16 beside PyTorch's
# autocast-bf16 step, with the bytes each step copies; everything lands in $OUT:
#   machine.txt, gpu-check.json, gpu-check.log
# The device tool's call (one call, 10 minutes at most):
#   run(command="bash bench/gpu/run.sh", carry=["target/cuda/fpt-cuda.gz"], timeout_s=600)
# Then commit $OUT's files as bench/gpu/<date>T<time>Z-<card>-gpu-check.{json,log}.
# The build's commit is gpu-check.json's "build" (the device copy's git metadata may be stale).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
start=$(date +%s)

gz=target/cuda/fpt-cuda.gz
if [ ! -s "$gz" ]; then
    echo "no $gz: build it with \`cargo xtask cuda-build\` and carry it" >&2
    exit 2
fi
gunzip -c "$gz" > /tmp/fpt-cuda && chmod +x /tmp/fpt-cuda

# cuBLAS, cuRAND and the CUDA 13 runtime: PyTorch's wheels carry them.
py="${FPT_PYTHON:-python3}"
cu13=$("$py" -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "lib"))' 2>/dev/null || true)
if [ -n "$cu13" ] && [ -d "$cu13" ]; then
    export LD_LIBRARY_PATH="$cu13:${LD_LIBRARY_PATH:-}"
fi

{
    date -u +%Y-%m-%dT%H:%MZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    "$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1
    nproc
    uname -r
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# FPT_GPU_DEVICE=cpu tries the whole command on a machine without a GPU.
FPT_PYTHON="$py" timeout "${FPT_GPU_CHECK_TIMEOUT:-560}" /tmp/fpt-cuda gpu-check --device "${FPT_GPU_DEVICE:-cuda:0}" --out "$OUT/gpu-check.json" "$@" 2>&1 | tee "$OUT/gpu-check.log"
rc=${PIPESTATUS[0]}
echo "bench/gpu/run.sh: fpt gpu-check exited $rc after $(( $(date +%s) - start )) s"
exit "$rc"
