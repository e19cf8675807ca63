#!/usr/bin/env bash
# Canaries: each patch here removes or breaks one guard of the core (see docs/canaries.md). For
# each, this script applies it to a scratch copy of the workspace, builds the simulator in
# release, runs a bounded seed batch, and requires a failing seed; it then shrinks that seed to
# a scenario and requires the scenario to fail too. A patch that no longer applies fails.
#
# Usage: sim/canaries/run.sh [SEEDS] [PATCH...]   (default: 5000 seeds, every patch)
# Env: CANARY_TARGET_DIR (default: a target dir inside the scratch copy), CANARY_JOBS (default 2).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seeds="${1:-5000}"
shift || true
patches=("$@")
if [ ${#patches[@]} -eq 0 ]; then
    patches=("$here"/*.patch)
fi
jobs="${CANARY_JOBS:-2}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/sim-canaries.XXXXXX")"
trap 'rm -rf "$scratch/work"' EXIT
work="$scratch/work"
mkdir -p "$work"
(cd "$root" && tar --exclude=./target --exclude=./.git -cf - .) | (cd "$work" && tar -xf -)
# A target directory kept from an earlier run (CANARY_TARGET_DIR) may hold a build of the last
# patch it applied, newer than these copies (tar keeps their times): touched, they are rebuilt,
# never taken for that build (a patch of the simulator alone, f01, ran on the last run's
# patched core).
find "$work" -name '*.rs' -exec touch {} +
export CARGO_TARGET_DIR="${CANARY_TARGET_DIR:-$scratch/target}"
sim="$CARGO_TARGET_DIR/release/sim"
failed=0
summary=()
for patch in "${patches[@]}"; do
    name="$(basename "$patch" .patch)"
    if ! (cd "$work" && patch -p1 --forward --batch --silent --dry-run < "$patch" > /dev/null); then
        echo "FAIL $name: the patch no longer applies (update it to the core's current guard)"
        summary+=("$name: patch does not apply")
        failed=1
        continue
    fi
    (cd "$work" && patch -p1 --forward --batch --silent < "$patch")
    # A patch may name simulator options its race needs, on a line `sim-options: ...` before
    # its diff (e.g. `--operations`: the application also enters sandboxes for work).
    read -r -a options <<< "$(sed -n 's/^sim-options: //p' "$patch" | head -1)"
    # And how many seeds its race needs at least (`sim-seeds: N`), when rarer than the batch.
    need="$(sed -n 's/^sim-seeds: //p' "$patch" | head -1)"
    run_seeds="$seeds"
    if [ -n "$need" ] && [ "$need" -gt "$seeds" ]; then run_seeds="$need"; fi
    if ! cargo build --quiet --release -p sim --manifest-path "$work/Cargo.toml"; then
        echo "FAIL $name: the patched workspace does not build"
        summary+=("$name: does not build")
        failed=1
    else
        out="$("$sim" explore --seeds "$run_seeds" --jobs "$jobs" --stop-at-first "${options[@]}" 2>&1)"
        first="$(grep -m1 '^FAIL seed' <<< "$out" || true)"
        if [ -z "$first" ]; then
            echo "FAIL $name: no failing seed in $run_seeds seeds"
            summary+=("$name: NOT FOUND in $run_seeds seeds")
            failed=1
        else
            seed="$(sed -E 's/^FAIL seed ([0-9]+):.*/\1/' <<< "$first")"
            invariant="$(sed -E 's/^FAIL seed [0-9]+: invariant ([^ ]+).*/\1/' <<< "$first")"
            scn="$scratch/$name.scn"
            shrunk="not shrunk"
            if "$sim" shrink --seed "$seed" --out "$scn" "${options[@]}" > "$scratch/$name.shrink.log" 2>&1; then
                "$sim" run --quiet "$scn" > /dev/null 2>&1
                rc=$?
                # The steps: every line but comments and the header (config, and a fleet's line).
                lines="$(grep -vcE '^(#|config |fleet )' "$scn")"
                if [ "$rc" = 1 ]; then
                    shrunk="shrunk to $lines steps, fails when run"
                else
                    shrunk="shrunk scenario exits $rc (expected 1)"
                fi
            fi
            echo "ok   $name: found by seed $seed ($((seed + 1)) seeds) breaking $invariant; $shrunk"
            summary+=("$name: seed $seed -> $invariant; $shrunk")
        fi
    fi
    (cd "$work" && patch -p1 -R --batch --silent < "$patch")
done
echo
echo "canary summary ($seeds seeds each):"
printf '  %s\n' "${summary[@]}"
echo "shrunk scenarios kept in $scratch"
exit "$failed"
