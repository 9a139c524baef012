#!/usr/bin/env bash
# One short device call that looks for the GPU path's bad memory accesses on ListOps (issue
# 56: the pretrained MiniLM's ListOps probes died of a device-side index_select assert and
# an illegal address). compute-sanitizer's memcheck over a few steps of ListOps with
# sequences of 512 tokens, then the same run plain for longer. Random init: the pretrained
# weights do not fit a call's 64 MiB beside the tree. First run (2026-11-27, H100): memcheck
# found 0 errors but the evaluation's loss was 2^60 at step 2; the plain run stopped on
# index_select's assert `ids[id_i] < src_dim_size` (the embedding's ids outside its table),
# ids that the CPU path, which checks them, never sees. Now also initcheck (reads of device
# memory nothing wrote), at most 110 s more (its timeout): the whole call stays under ~430 s.
# Prepared here:
#   mkdir -p target/gpu-probe/home/data/listops   # 1000/200/200 lines of ListOps' splits
#   xz -c target/cuda/fpt-cuda > target/gpu-probe/fpt-cuda.xz; tar cJf target/gpu-probe/home.txz -C target/gpu-probe home
#   run(command="bash bench/gpu/sanitize.sh", carry=["target/gpu-probe/fpt-cuda.xz",
#       "target/gpu-probe/home.txz", "target/device-hub.tgz"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
B=/tmp/fpt-cuda
t0=$(date +%s)
# The binary: the xz copy made for this call, or else the session's gzip one
# (target/cuda/fpt-cuda.gz, `cargo xtask cuda-build`) when both scripts share one call.
if [ -s target/gpu-probe/fpt-cuda.xz ]; then
    xz -dc target/gpu-probe/fpt-cuda.xz > $B 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open('target/gpu-probe/fpt-cuda.xz').read())" > $B
else
    gunzip -c target/cuda/fpt-cuda.gz > $B || exit 2
fi
chmod +x $B
mkdir -p /tmp/probe && tar xJf target/gpu-probe/home.txz -C /tmp/probe && tar xzf target/device-hub.tgz -C /tmp/probe
cu13=$(python3 -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "lib"))' 2>/dev/null || true)
[ -n "$cu13" ] && [ -d "$cu13" ] && export LD_LIBRARY_PATH="$cu13:${LD_LIBRARY_PATH:-}"
export HF_HUB_CACHE=/tmp/probe/device-hub HF_HUB_OFFLINE=1 FPT_HOME=/tmp/probe/home
nvidia-smi -L > "$OUT/machine.txt" 2>&1; uname -r >> "$OUT/machine.txt"
args=(train --task listops --backbone sentence-transformers/all-MiniLM-L6-v2 --init random --brackets keep
      --batch-size 16 --eval-examples 32 --seed 0 --device cuda:0)
echo "setup $(( $(date +%s) - t0 )) s" > "$OUT/times.txt"
# SAN_S=0 skips memcheck (it found nothing on 2026-11-27); SAN_ENV sets its environment
# (SAN_ENV=FPT_ATTENTION=mma: the tensor-core attention's kernels, new on 2026-11-29, under
# memcheck); VARIANTS picks the plain runs.
if [ "${SAN_S:-110}" != 0 ]; then
    env ${SAN_ENV:-} timeout "${SAN_S:-110}" compute-sanitizer --tool memcheck --print-limit 20 --show-backtrace device \
        $B "${args[@]}" --steps 4 --eval-every 2 --out /tmp/probe/san > "$OUT/memcheck.log" 2>&1
    echo "memcheck exit $? at $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
fi
# memcheck saw no bad access while the evaluation's loss came out 2^60: the signature of a
# read of device memory nothing wrote (a fresh allocation's garbage), which memcheck does
# not look for and initcheck does: it names the kernel that read it. INIT_S=0 skips it.
if [ "${INIT_S:-110}" != 0 ]; then
    timeout "${INIT_S:-110}" compute-sanitizer --tool initcheck --print-limit 20 --show-backtrace device \
        $B "${args[@]}" --steps 2 --eval-every 2 --out /tmp/probe/init > "$OUT/initcheck.log" 2>&1
    echo "initcheck exit $? at $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
fi
# Plain, then reading every upload and the embedding's ids back (FPT_CHECK_DEVICE=1: an
# error names an upload the device holds differently, or an id outside the table), then
# with every launch synchronous (a race between streams, if any, goes away), then with the
# attention tiled over keys instead of the composed ops (FPT_ATTENTION=tiled: if the fault
# lives in the attention's path, this run does not have it), then on the tensor cores
# (FPT_ATTENTION=mma: that family's kernels over many steps and evaluations).
for v in ${VARIANTS:-plain check blocking tiled}; do
    case $v in
        plain) env=() ;;
        check) env=(FPT_CHECK_DEVICE=1) ;;
        blocking) env=(CUDA_LAUNCH_BLOCKING=1) ;;
        tiled) env=(FPT_ATTENTION=tiled) ;;
        mma) env=(FPT_ATTENTION=mma) ;;
    esac
    env "${env[@]}" FPT_LOG=info timeout "${PLAIN_S:-40}" $B "${args[@]}" --steps 2000 --eval-every 2 \
        --out /tmp/probe/$v > "$OUT/$v.log" 2>&1
    echo "$v exit $? at $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"
done
cat "$OUT/times.txt"; tail -5 "$OUT/memcheck.log" 2>/dev/null; grep -m 12 -E 'Uninitialized|at 0x|by thread|Saved host backtrace' "$OUT/initcheck.log" 2>/dev/null; for v in ${VARIANTS:-plain check blocking tiled}; do grep -v '<unknown>' "$OUT/$v.log" | tail -3; done
