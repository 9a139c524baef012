#!/usr/bin/env bash
# A short device call for the replayed step and evaluation (issue 56 item 1), when a lease
# has only a few minutes left: `fpt gpu-check` with FPT_STEP=replay (its training run
# replayed on the device beside the CPU's, the 12 replay checks, one bench shape replayed
# against PyTorch), `fpt bench --graph` (the step and an evaluation, eager and replayed),
# then, if every replay check passed, campaign runs with replayed steps for CAMPAIGN_S.
#   run(command="bash bench/gpu/replay-check.sh", carry=["target/cuda/fpt-cuda.gz",
#       "target/device-hub", "target/gpu-probe/mnist.txz"], timeout_s=240)
# Written 2026-11-28 after the lease of that day found the replayed evaluation reading
# freed uploads (bench/gpu/2026-11-28T1630Z-h200-replay-diagnosis-*).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
export OUT
start=$(date +%s)
cu13=$(python3 -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "lib"))' 2>/dev/null || true)
[ -n "$cu13" ] && [ -d "$cu13" ] && export LD_LIBRARY_PATH="$cu13:${LD_LIBRARY_PATH:-}"
FPT_STEP=replay FPT_GPU_CHECK_TIMEOUT="${CHECK_S:-120}" bash bench/gpu/run.sh --steps 60 \
    --shape "${CHECK_SHAPE:-minilm-mnist}" --precision f32 > /dev/null 2>&1
echo "replay-check: gpu-check exited $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
timeout "${GRAPH_S:-30}" /tmp/fpt-cuda bench --graph --json --shape minilm-mnist --steps 20 --warmup 3 \
    --device "${FPT_GPU_DEVICE:-cuda:0}" > "$OUT/graph.json" 2> "$OUT/graph.err"
echo "replay-check: graph exited $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
if [ -n "${FPT_CAMPAIGN_RUNS:-}" ] && [ "${CAMPAIGN_S:-0}" -gt 0 ]; then
    # campaign.sh decides the step from this call's gpu-check.json (eager unless every
    # replay check passed).
    FPT_LEASE_DIR="$OUT" FPT_STEP=auto FPT_CAMPAIGN_FETCH="" FPT_CAMPAIGN_BUDGET="${CAMPAIGN_S}s" \
        bash bench/gpu/campaign.sh > /dev/null 2>&1
    echo "replay-check: campaign exited $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
fi
# At most 8 files come back from a call.
[ -f "$OUT/campaign-choice.log" ] && cat "$OUT/campaign-choice.log" >> "$OUT/session.log" && rm "$OUT/campaign-choice.log"
[ -s "$OUT/graph.err" ] || rm -f "$OUT/graph.err"
rm -f "$OUT/campaign-fetch.log"
