#!/usr/bin/env bash
# Re-renders every committed report (results/<id>/<scale>/, scales cpu, cpu-full and
# converge, or those named) with today's code, from the committed records and campaign
# copies alone, as crates/fpt-ablate/tests/committed_reports.rs renders them: on a copy of
# results/ without the local run directories (which may hold other machines' or unfinished
# runs), then copied back, and the results site rebuilt. Run it after a change to how
# reports judge or word their cells, and after a campaign stretch.
#   tools/rerender_reports.sh [scale ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p fpt-cli
fpt=target/release/fpt
scales=("$@")
[ ${#scales[@]} -gt 0 ] || scales=(cpu cpu-full converge)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd results && tar cf - --exclude=./runs .) | (cd "$tmp" && tar xf -)
for scale in "${scales[@]}"; do
    ids=()
    for d in results/*/"$scale"; do
        [ -f "$d/report.json" ] && ids+=("$(basename "$(dirname "$d")")")
    done
    [ ${#ids[@]} -gt 0 ] || continue
    echo "rerender: $scale: ${ids[*]}"
    "$fpt" run-table "${ids[@]}" --scale "$scale" --tables data/tables --report-only --out "$tmp" >/dev/null
    for id in "${ids[@]}"; do
        for f in "$tmp/$id/$scale"/*; do
            # The example command names the committed results/, not this copy.
            case "$f" in
                *.md) sed "s#$tmp/#results/#g" "$f" > "results/$id/$scale/$(basename "$f")" ;;
                *) cp "$f" "results/$id/$scale/" ;;
            esac
        done
    done
done
"$fpt" report results >/dev/null
echo "rerender: done; git diff --stat results/ shows what changed"
