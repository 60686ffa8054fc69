#!/usr/bin/env bash
# Fuzzes myriad's parsers: builds the libFuzzer binary in fuzz/ (nightly,
# cargo-fuzz, AddressSanitizer) once, then runs each target for the given
# time on its corpus in fuzz/corpus/<target>/, and minimises the corpus
# afterwards so the repository keeps only inputs that add coverage.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Default: 60 s for every target in crates/fuzz/src/lib.rs. Exits non-zero
# if any target crashed (a failed property, a panic, a timeout, a leak),
# printing the input that did it; reproduce one with
#   MYRIAD_FUZZ_TARGET=<target> <binary> <input>
# and once fixed keep it in fuzz/regressions/<target>/, which the stable
# tests (crates/fuzz/tests/corpus.rs) replay with the whole corpus.
#
# Environment: FUZZ_TOOLCHAIN (nightly), FUZZ_TARGET_DIR (fuzz/target),
# FUZZ_MAX_LEN (4096, the longest input tried), FUZZ_JOBS (cargo build jobs).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-60}"
[[ $# -gt 0 ]] && shift
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds == 0)); then
    echo "usage: scripts/fuzz.sh [seconds-per-target] [target...]" >&2
    exit 2
fi
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
target_dir="${FUZZ_TARGET_DIR:-fuzz/target}"
max_len="${FUZZ_MAX_LEN:-4096}"

if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
    echo "fuzzing needs the $toolchain toolchain: rustup toolchain install $toolchain" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

echo "==> building the fuzz binary (fuzz/fuzz_targets/check.rs)"
[[ -n ${FUZZ_JOBS:-} ]] && export CARGO_BUILD_JOBS="$FUZZ_JOBS"
cargo "+$toolchain" fuzz build --target-dir "$target_dir" check
host="$(rustc "+$toolchain" -vV | sed -n 's/^host: //p')"
bin="$target_dir/$host/release/check"

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(MYRIAD_FUZZ_TARGET=list "$bin")
fi

crashed=()
summary=()
for target in "${targets[@]}"; do
    corpus="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    mkdir -p "$corpus" "$artifacts"
    log="$artifacts/run.log"
    dict=()
    [[ -f fuzz/dict/$target.dict ]] && dict=("-dict=fuzz/dict/$target.dict")
    echo "==> $target: ${seconds}s on $corpus (log: $log)"
    status=0
    MYRIAD_FUZZ_TARGET="$target" "$bin" \
        -max_total_time="$seconds" -timeout=10 -max_len="$max_len" \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
        "$corpus" >"$log" 2>&1 || status=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    if ((status != 0)); then
        artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
        echo "!!! $target crashed (exit $status); input: ${artifact:-none written, see $log}"
        grep -m1 -A12 -E "panicked at|ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)" "$log" || tail -20 "$log"
        crashed+=("$target: ${artifact:-$log}")
    fi
    # Minimise, after a crash too (what the run added stays in the corpus
    # folder otherwise); as `cargo fuzz cmin` does, but by set cover, which
    # keeps fewer files: the smallest set of inputs reaching the same code.
    # Edges only (-use_counters=0): hit-count buckets would keep hundreds
    # of inputs that differ only in how often a loop ran.
    merged="$(mktemp -d "$artifacts/cmin.XXXXXX")"
    if MYRIAD_FUZZ_TARGET="$target" "$bin" -set_cover_merge=1 -use_counters=0 \
        -timeout=10 -max_len="$max_len" \
        "$merged" "$corpus" >"$artifacts/cmin.log" 2>&1 &&
        [[ -n "$(ls -A "$merged")" ]]; then
        find "$corpus" -type f -delete
        mv "$merged"/* "$corpus"/
    else
        echo "!!! $target: minimising failed, corpus left as it was (see $artifacts/cmin.log)"
    fi
    rm -rf "$merged"
    files="$(find "$corpus" -type f | wc -l)"
    kib="$(find "$corpus" -type f -printf '%s\n' | awk '{s += $1} END {printf "%d", s / 1024}')"
    result="$( ((status == 0)) && echo ok || echo CRASHED)"
    summary+=("$(printf '%-14s %6ss %12s execs  %4s files %6s KiB  %s' \
        "$target" "$seconds" "${execs:-?}" "$files" "$kib" "$result")")
done

echo
echo "==> summary"
printf '%s\n' "${summary[@]}"
if ((${#crashed[@]} > 0)); then
    echo
    echo "crashes:"
    printf '  %s\n' "${crashed[@]}"
    exit 1
fi
