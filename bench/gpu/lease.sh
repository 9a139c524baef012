#!/usr/bin/env bash
# A lent GPU's whole 15 minutes as one call (issues 54 and 56): the session's check and
# timings (bench/gpu/session.sh, bounded by SESSION_S), then the ListOps fault's sanitizer
# and plain runs (bench/gpu/sanitize.sh, without memcheck, which found nothing before).
# A call brings back at most 8 files, so everything lands packed in $OUT:
#   machine.txt, gpu-check.json, gpu-check.log, session.log   (copies, for a quick look)
#   lease.tgz                                                   (both scripts' whole output)
# Prepared here: `cargo xtask cuda-build`; the ListOps splits in target/gpu-probe/home.txz
# (bench/gpu/sanitize.sh says how). The call:
#   run(command="bash bench/gpu/lease.sh", carry=["target/cuda/fpt-cuda.gz",
#       "target/gpu-probe/home.txz", "target/device-hub.tgz"], timeout_s=580)
# Times (seconds): SESSION_S (330) for the session: its check on the campaign's MNIST shape
# alone (CHECK_SHAPES, CHECK_S 175), one round of the tiled/epilogue/branch timings and the
# graph experiment (GRAPH_S 60), no runs-at-once (AT_ONCE) and no probes; then the sanitizer
# part: initcheck (INIT_S 90) and 30 s (PLAIN_S) each of the check, blocking and tiled runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
final="${OUT:-$(mktemp -d)}"
work=/tmp/lease
rm -rf "$work" && mkdir -p "$work/session" "$work/sanitize"
t0=$(date +%s)
OUT="$work/session" DEADLINE_S="${SESSION_S:-330}" CHECK_S="${CHECK_S:-175}" \
    CHECK_SHAPES="${CHECK_SHAPES-minilm-mnist}" AT_ONCE="${AT_ONCE-}" TILED_ROUNDS="${TILED_ROUNDS:-1}" \
    GRAPH_S="${GRAPH_S:-60}" PROBES="${PROBES- }" WORK_S="${WORK_S:-0}" bash bench/gpu/session.sh
echo "lease: session part done after $(( $(date +%s) - t0 )) s" >> "$work/session/session.log"
OUT="$work/sanitize" SAN_S="${SAN_S:-0}" INIT_S="${INIT_S:-90}" PLAIN_S="${PLAIN_S:-30}" \
    VARIANTS="${VARIANTS-check blocking tiled}" bash bench/gpu/sanitize.sh
echo "lease: sanitizer part done after $(( $(date +%s) - t0 )) s" >> "$work/session/session.log"
for f in machine.txt gpu-check.json gpu-check.log session.log; do
    [ -f "$work/session/$f" ] && cp "$work/session/$f" "$final/"
done
tar czf "$final/lease.tgz" -C "$work" session sanitize
echo "lease: packed after $(( $(date +%s) - t0 )) s"
