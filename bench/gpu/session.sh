#!/usr/bin/env bash
# A lent GPU's one prepared call (issues 54 and 56): `fpt gpu-check` on a reduced bench
# (the shapes earlier records could not time, and the campaign's MNIST step), then ListOps
# probes of the frozen pretrained MiniLM and campaign runs side by side until the call's
# time is spent. Everything lands in $OUT:
#   machine.txt, gpu-check.{json,log}        the check (bench/gpu/run.sh)
#   probes/<name>/{spec.json,metrics.jsonl,history.jsonl,result.json?}, probes/<name>.log
#   at-once.jsonl                            N campaign MNIST steps at once, fpt and PyTorch
#   streams.jsonl                            the same step as N runs in one process (a stream each)
#   tiled-bench.jsonl                        FPT_SOFTMAX=composed, FPT_ATTENTION=tiled, the default (and TILED_VARIANTS')
#   lstm-bench.jsonl                         lstm-listops: the LSTM's block-per-row kernels and FPT_LSTM=composed
#   bf16-bench.jsonl                         minilm-mnist in f32, bf16 autocast, bf16 chosen per shape
#   graph.json, graph.err                    the MiniLM step as a replayed CUDA graph beside it eager
#   profile-<shape>-*, profile.log           PROFILE_SHAPES' kernel times, fpt's and PyTorch's (bench/gpu/profile.sh)
#   campaign/<key>/ and campaign.log         runs to copy into results/campaign/ here
# Carried (ignored paths): target/cuda/fpt-cuda.gz (`cargo xtask cuda-build`) and
# target/device-hub.tgz (`bash bench/gpu/campaign.sh --prepare [--weights]`, then
# `tar czf target/device-hub.tgz -C target device-hub`): the campaign's runs read it, and
# the probes too unless PROBE_HUB names another folder under target/ (a `probe-hub.tgz`
# carried beside it is unpacked there). When the working tree and the exact weights do not
# fit a call's 64 MiB, the probes can read MiniLM's weights rounded to f16 (21 MB; hidden
# states within 1.9e-3 relative of f32's) from a probe hub that no campaign run reads.
#   run(command="bash bench/gpu/session.sh", carry=["target/cuda/fpt-cuda.gz",
#       "target/device-hub.tgz"], timeout_s=560)
# Times (seconds): CHECK_S for the check (190), then the runs-at-once measurement (about 15 s
# a side and N: ~180 s for AT_ONCE="1 4 8" over 2 rounds, an estimate: never run yet) and
# the softmax ops' and the tiled attention's (~120 s: 2 rounds of 2 shapes, 3 ways), the graph experiment (~20 s, at most 90; these two are estimates too, never run),
# then WORK_S for probes and campaign together. All of it at the defaults is ~550 s before WORK_S: one 560 s call cannot hold
# everything, so choose (AT_ONCE="1 4", TILED_ROUNDS=1, TILED_SHAPES="", GRAPH_SHAPES="",
# CHECK_S=0 each cut a part) or split it over two calls (the second with CHECK_S=0);
# FPT_CAMPAIGN_RUNS the campaign's keys; PROBES "name:batch:brackets ..." the probes.
# FPT_GPU_DEVICE=cpu tries the whole command on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
export OUT
mkdir -p "$OUT/probes"
start=$(date +%s)
dev="${FPT_GPU_DEVICE:-cuda:0}"
# DEADLINE_S (seconds from the start) bounds the whole script: each part's timeout is cut to
# what is left, and a part with under 10 s left is skipped, so a call's timeout_s set above it
# always brings the files back. `left N` prints min(N, what is left).
deadline="${DEADLINE_S:-100000}"
left() { local l=$(( deadline - ($(date +%s) - start) )); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
for hub in device-hub probe-hub; do
    if [ -s "target/$hub.tgz" ]; then
        tar xzf "target/$hub.tgz" -C target || exit 2
    fi
done
gunzip -c target/cuda/fpt-cuda.gz > /tmp/fpt-cuda && chmod +x /tmp/fpt-cuda || exit 2

# 1. The check and a reduced bench (run.sh records the machine); CHECK_S=0 skips it.
# CHECK_SHAPES the bench's shapes after the checks; CHECK_STEP the step they time against
# PyTorch's: `auto` (the default since 2026-11-28: replayed, a CUDA graph a step with its
# loss read back every step, but for the LSTM's shapes), `eager` or `replay`;
# CHECK_PRECISION their precisions (`f32`; "f32 bf16" for both, bf16 beside autocast).
if [ "${CHECK_S:-190}" != 0 ]; then
    FPT_STEP="${CHECK_STEP:-auto}" FPT_GPU_CHECK_TIMEOUT="$(left "${CHECK_S:-190}")" bash bench/gpu/run.sh --steps 100 \
        $(for s in ${CHECK_SHAPES-minilm-mnist lstm-listops smollm2-mnist}; do echo --shape "$s"; done) \
        $(for p in ${CHECK_PRECISION-f32}; do echo --precision "$p"; done) >/dev/null 2>&1
    echo "session: gpu-check exited $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
fi

py="${FPT_PYTHON:-python3}"
cu13=$("$py" -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "lib"))' 2>/dev/null || true)
if [ -n "$cu13" ] && [ -d "$cu13" ]; then
    export LD_LIBRARY_PATH="$cu13:${LD_LIBRARY_PATH:-}"
fi

# 1b. How many campaign runs the GPU should train at once (issue 56 items 2 and 8): for
# each N of AT_ONCE, N processes of the campaign's MNIST step (`minilm-mnist`) side by
# side, their timed steps started together (`--barrier`), then N of PyTorch's same step;
# rounds alternate. One JSON line per process in at-once.jsonl; `cargo xtask bench
# at-once bench/gpu/<stamp>-at-once.jsonl --record` makes the record here. AT_ONCE="" skips it;
# AT_ONCE_THREADS sets each fpt process's thread pool (default: one thread a core, 16 on
# the H100 machines: four processes start 64).
at_once_round() { # side n round
    local side=$1 n=$2 r=$3 dir="/tmp/at-once-$1-$2-$3" pids=() i
    rm -rf "$dir" && mkdir -p "$dir"
    for i in $(seq "$n"); do
        [ "$(left 120)" -lt 10 ] && return
        if [ "$side" = fpt ]; then
            RAYON_NUM_THREADS="${AT_ONCE_THREADS:-}" timeout "$(left 120)" /tmp/fpt-cuda bench --json --no-full --shape minilm-mnist --steps "${AT_ONCE_STEPS:-200}" \
                --warmup 20 --device "$dev" --barrier "$dir" --at-once "$n" --barrier-timeout 60 > "$dir/out-$i" 2>/dev/null &
        else
            timeout "$(left 120)" "$py" bench/pytorch_fpt_step.py --fpt /tmp/fpt-cuda --shape minilm-mnist --no-full \
                --steps "${AT_ONCE_STEPS:-200}" --warmup 20 --device "$dev" --barrier "$dir" --at-once "$n" > "$dir/out-$i" 2>/dev/null &
        fi
        pids+=($!)
    done
    wait "${pids[@]}"
    for i in $(seq "$n"); do
        [ -s "$dir/out-$i" ] && echo "{\"side\":\"$side\",\"at_once\":$n,\"round\":$r,\"out\":$(tail -1 "$dir/out-$i")}" >> "$OUT/at-once.jsonl"
    done
}
for r in $(seq "${AT_ONCE_ROUNDS:-2}"); do
    for n in ${AT_ONCE-1 4 8}; do
        at_once_round fpt "$n" "$r"
        at_once_round pytorch "$n" "$r"
    done
done
[ -s "$OUT/at-once.jsonl" ] && echo "session: at-once measured after $(( $(date +%s) - start )) s ($(wc -l < "$OUT/at-once.jsonl") processes)" | tee -a "$OUT/session.log"

# 1b'. The same step as N runs in one process, each on a stream of its own (`fpt bench
# --streams N`: their kernels may overlap on the GPU, which N processes' cannot without MPS),
# N from STREAMS, each with the replayed step (FPT_STEP=replay: a CUDA graph a run, what
# the campaign's second call trains with) and the eager one (STREAM_STEPS), rounds
# alternating: one JSON line per measurement in streams.jsonl ({"streams": N, "step":
# "replay"|"eager", "round": R, "out": <fpt bench --json>}). STREAMS="" skips it.
for r in $(seq "${STREAMS_ROUNDS:-2}"); do
    for step in ${STREAM_STEPS-replay eager}; do
        for n in ${STREAMS-1 2 4 8}; do
            [ "$(left 60)" -lt 10 ] && continue
            o=$(FPT_STEP="$step" timeout "$(left 60)" /tmp/fpt-cuda bench --json --no-full --shape minilm-mnist --streams "$n" \
                --steps "${AT_ONCE_STEPS:-200}" --warmup 20 --device "$dev" 2>>"$OUT/streams.err" | tail -1)
            [ -n "$o" ] && echo "{\"streams\":$n,\"step\":\"$step\",\"round\":$r,\"out\":$o}" >> "$OUT/streams.jsonl"
        done
    done
done
[ -s "$OUT/streams.jsonl" ] && echo "session: runs in one process timed after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"

# 1c. The attention's softmax and dropout as separate ops (FPT_SOFTMAX=composed: before
# the one-pass ops of 2026-11-29) and the attention tiled over keys (issue 56 item 5)
# against the default, the long-sequence shapes, alternating rounds: one JSON line per
# process in tiled-bench.jsonl ({"variant": "auto"|"FPT_SOFTMAX=composed"|
# "FPT_ATTENTION=tiled"|"FPT_ATTENTION=mma"|..., "round": R, "out": <fpt bench --json>};
# mma: the tiled attention on the tensor cores; a variant written bf16:V runs V in bf16
# precision, e.g. bf16:auto against bf16:FPT_ATTENTION=mma-tf32, one TF32 term a product).
# TILED_SHAPES="" skips
# it; TILED_VARIANTS picks the variants (also FPT_LINEAR=product, the bias added after
# cuBLAS's product, and FPT_BRANCH=composed, the residual branches composed of candle's
# ops: both measured on an H100 on 2026-11-27, 5% slower than the default each).
for r in $(seq "${TILED_ROUNDS:-2}"); do
    for s in ${TILED_SHAPES-lra minilm-listops}; do
        for v in ${TILED_VARIANTS-auto FPT_SOFTMAX=composed FPT_ATTENTION=tiled FPT_ATTENTION=mma}; do
            [ "$(left 120)" -lt 10 ] && continue
            p=f32 && e="$v" && case "$v" in bf16:*) p=bf16 && e="${v#bf16:}" ;; esac
            o=$(env "$([ "$e" = auto ] && echo FPT_ATTENTION=auto || echo "$e")" timeout "$(left "${TILED_TIMEOUT:-120}")" /tmp/fpt-cuda bench --json \
                --no-full --shape "$s" --precision "$p" --steps 20 --warmup 3 --device "$dev" 2>>"$OUT/tiled-bench.err" | tail -1)
            [ -n "$o" ] && echo "{\"variant\":\"$v\",\"round\":$r,\"out\":$o}" >> "$OUT/tiled-bench.jsonl"
        done
    done
done
[ -s "$OUT/tiled-bench.jsonl" ] && echo "session: the softmax ops and the tiled attention timed after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"

# 1c'. The layer-norm LSTM's recurrence as one block per batch row (kernels/fpt_lstm.h:
# one launch a layer each way, the default on a GPU since 2026-11-28) against the composed
# ops (FPT_LSTM=composed: some 20 launches a step forward, more backward, 3.3 s an lstm-listops step on the H100
# of 2026-11-27), alternating rounds: one JSON line per process in lstm-bench.jsonl
# ({"variant": "FPT_LSTM=auto"|"FPT_LSTM=composed", "round": R, "out": <fpt bench --json>}).
# The composed side times 3 steps (about 15 s). LSTM_SHAPES="" skips it.
for r in $(seq "${LSTM_ROUNDS:-2}"); do
    for s in ${LSTM_SHAPES-lstm-listops}; do
        for v in FPT_LSTM=auto FPT_LSTM=composed; do
            [ "$(left 60)" -lt 10 ] && continue
            n=20 && [ "$v" = FPT_LSTM=composed ] && n=3
            o=$(env "$v" timeout "$(left 60)" /tmp/fpt-cuda bench --json --no-full --shape "$s" --steps "$n" \
                --warmup 1 --device "$dev" 2>>"$OUT/lstm-bench.err" | tail -1)
            [ -n "$o" ] && echo "{\"variant\":\"$v\",\"round\":$r,\"out\":$o}" >> "$OUT/lstm-bench.jsonl"
        done
    done
done
[ -s "$OUT/lstm-bench.jsonl" ] && echo "session: the LSTM's kernels and composed ops timed after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"

# 1c''. A frozen bf16 weight's product chosen per shape (issue 56 item 7, ops/bf16_choice.rs):
# the step in f32, in bf16 with autocast's product pinned (FPT_BF16_PRODUCT=autocast: every
# record before 2026-11-28), and in bf16 with the faster product per shape (the default): one
# JSON line per process in bf16-bench.jsonl ({"variant": "f32"|"autocast"|"auto", "round": R,
# "out": <fpt bench --json>, whose bf16_products lists each shape's choice and both times}).
# About 15 s a process. BF16_SHAPES="" skips it.
for r in $(seq "${BF16_ROUNDS:-1}"); do
    for s in ${BF16_SHAPES-minilm-mnist}; do
        for v in f32 autocast auto; do
            [ "$(left 60)" -lt 10 ] && continue
            p=bf16 && [ "$v" = f32 ] && p=f32
            o=$(env FPT_BF16_PRODUCT="$([ "$v" = autocast ] && echo autocast || echo auto)" timeout "$(left 60)" \
                /tmp/fpt-cuda bench --json --no-full --shape "$s" --precision "$p" --steps 20 --warmup 3 \
                --device "$dev" 2>>"$OUT/bf16-bench.err" | tail -1)
            [ -n "$o" ] && echo "{\"variant\":\"$v\",\"round\":$r,\"out\":$o}" >> "$OUT/bf16-bench.jsonl"
        done
    done
done
[ -s "$OUT/bf16-bench.jsonl" ] && echo "session: bf16 products timed after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"

# 1d. The step as one CUDA graph (issue 56 item 1: `fpt bench --graph` trains the MiniLM
# step replayed from device memory, captured once and replayed on fresh batches, beside the
# eager step; ~20 s estimated). One JSON object in graph.json (both timings, the replays'
# first and last training loss, skipped steps), errors (a capture the driver or candle refuse,
# named by stage) in graph.err. `fpt gpu-check` checks the replay against the eager step.
# GRAPH_SHAPES="" skips it.
if [ -n "${GRAPH_SHAPES-minilm-mnist minilm-listops}" ] && [ "$(left 90)" -ge 10 ]; then
    timeout "$(left "${GRAPH_S:-90}")" /tmp/fpt-cuda bench --graph --json $(for s in ${GRAPH_SHAPES-minilm-mnist minilm-listops}; do echo --shape "$s"; done) \
        --steps 20 --warmup 3 --device "$dev" > "$OUT/graph.json" 2> "$OUT/graph.err"
    echo "session: graph experiment exited $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
fi

# 1e. Where a step's device time goes (bench/gpu/profile.sh: fpt's kernels by Nsight
# Compute, one warm-up and one timed step; PyTorch's step by torch.profiler), for each of
# PROFILE_SHAPES (none by default; lra is the shape furthest behind PyTorch's): the files
# profile-<shape>-{ncu.csv,fpt.txt,pytorch.txt}. About 60-120 s a shape (an estimate).
for s in ${PROFILE_SHAPES-}; do
    [ "$(left 150)" -lt 30 ] && continue
    OUT="$OUT" FPT_PROFILE_TIMEOUT="$(left 120)" bash bench/gpu/profile.sh "$s" >> "$OUT/profile.log" 2>&1
    echo "session: $s profiled after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
done

# 2. ListOps probes and campaign runs, side by side, for WORK_S seconds.
export HF_HUB_CACHE="$PWD/target/device-hub" HF_HUB_OFFLINE=1 FPT_HOME="${FPT_HOME:-/tmp/fpt-home}"
work="$(left "${WORK_S:-300}")"
if [ "$work" -lt 10 ]; then PROBES=" "; FPT_CAMPAIGN_RUNS=""; fi
# ListOps (LRA's procedure, a minute or so) only when a probe or a run will read it.
if [ -z "${PROBES:-}" ] || [ -n "${PROBES// /}" ] || [ -n "${FPT_CAMPAIGN_RUNS:-}" ]; then
    /tmp/fpt-cuda fetch listops > "$OUT/fetch.log" 2>&1
fi
for p in ${PROBES:-b16-drop:16:drop b16-keep:16:keep b4-keep:4:keep}; do
    IFS=: read -r name batch brackets <<< "$p"
    HF_HUB_CACHE="$PWD/target/${PROBE_HUB:-device-hub}" FPT_LOG=info timeout -s INT "$work" /tmp/fpt-cuda train --task listops --backbone sentence-transformers/all-MiniLM-L6-v2 \
        --batch-size "$batch" --brackets "$brackets" --lr 1e-3 --steps 20000 --eval-every "${PROBE_EVAL_EVERY:-250}" --eval-examples 500 \
        --seed 0 --device "$dev" --out "$OUT/probes/$name" > "$OUT/probes/$name.log" 2>&1 &
done
if [ -n "${FPT_CAMPAIGN_RUNS:-}" ]; then
    FPT_CAMPAIGN_BUDGET="$((work - 15))s" FPT_CAMPAIGN_JOBS="${FPT_CAMPAIGN_JOBS:-6}" \
        bash bench/gpu/campaign.sh > "$OUT/campaign-session.log" 2>&1 &
fi
wait
# Each probe's last checkpoint evaluated again on the device and on the CPU (the same
# binary): the GPU's evaluation checked against the CPU's on a real run.
for d in "$OUT"/probes/*/; do
    n=$(basename "$d")
    echo "probe $n: $(wc -l < "$d/metrics.jsonl" 2>/dev/null) evaluations, last: $(tail -1 "$d/metrics.jsonl" 2>/dev/null)" | tee -a "$OUT/session.log"
    if [ -f "$d/checkpoints/LATEST" ] && [ -n "${EVAL_CHECK-1}" ]; then
        for on in "$dev" cpu; do
            echo "probe $n: fpt eval --device $on: $(HF_HUB_CACHE="$PWD/target/${PROBE_HUB:-device-hub}" timeout 120 /tmp/fpt-cuda eval --device "$on" "$d" 2>&1 | tail -2 | tr '\n' ' ')" | tee -a "$OUT/session.log"
        done
    fi
done
rm -rf "$OUT"/probes/*/checkpoints "$OUT"/probes/*/events.out.tfevents.*
# At most 8 files come back from a call, 2 folders down: the probes and the campaign's
# runs travel as one archive each.
tar czf "$OUT/probes.tgz" -C "$OUT" probes && rm -rf "$OUT/probes"
if [ -d "$OUT/campaign" ]; then
    tar czf "$OUT/campaign.tgz" -C "$OUT" campaign campaign.log campaign-fetch.log campaign-session.log 2>/dev/null
    rm -rf "$OUT/campaign" "$OUT/campaign.log" "$OUT/campaign-fetch.log" "$OUT/campaign-session.log"
fi
rm -f "$OUT/fetch.log"
echo "session: done after $(( $(date +%s) - start )) s" | tee -a "$OUT/session.log"
