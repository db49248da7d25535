#!/usr/bin/env bash
# Run every fuzz target for a share of SECONDS (default 60, at least 5 s each); exit non-zero if one
# finds a crash. `make fuzz` and `make fuzz-smoke` (CI) call this; see fuzz/README.md.
#
# Targets: the input loaders (Python, Hypothesis: tests/input_fuzz.py; scenario TOML and trace JSONL), then
# the core (cargo-fuzz: core_ops, arbitration). FUZZ_SEED makes every target repeatable; FUZZ_RUNS bounds the
# core targets' executions and FUZZ_INPUTS the loaders' documents (CI's smoke run sets all three).
#
# Sanitizer: none by default. The core is safe Rust (no `unsafe`), so AddressSanitizer has nothing to
# find that a panic would not show, and it costs 4x the executions. FUZZ_SANITIZER=address turns it on;
# its -Zsanitizer flag is unstable, so RUSTC_BOOTSTRAP=1 is set to let a stable rustc accept it (a
# nightly ignores it). Without a sanitizer cargo-fuzz passes only stable flags.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 [SECONDS]" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

targets=(core_ops arbitration)
per_target=$((seconds / (${#targets[@]} + 1)))  # the loaders' target takes a share too
((per_target >= 5)) || per_target=5
failed=()

# The input loaders first: they need only the built package (make build), not cargo-fuzz.
python="${FUZZ_PYTHON:-../.venv/bin/python}"
[[ -x "$python" ]] || python=python3
if [[ -n "${FUZZ_INPUTS:-}" ]]; then
    # A fixed number of documents (with a seed: the same documents every time), however long they take.
    inputs_args=(--seconds 600 --examples "$FUZZ_INPUTS")
else
    inputs_args=(--seconds "$per_target")
fi
[[ -z "${FUZZ_SEED:-}" ]] || inputs_args+=(--seed "$FUZZ_SEED")
"$python" ../tests/input_fuzz.py "${inputs_args[@]}" || failed+=(inputs)

sanitizer="${FUZZ_SANITIZER:-none}"
bootstrap=""
if [[ "$sanitizer" != none ]]; then
    export RUSTC_BOOTSTRAP=1
    bootstrap="RUSTC_BOOTSTRAP=1 "
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    start=$SECONDS
    if ! cargo install cargo-fuzz --locked; then
        echo "fuzz: cargo-fuzz unavailable; the proptest cases in core carry this load"
        ((${#failed[@]} == 0)) || { echo "fuzz: failing targets: ${failed[*]}"; exit 1; }
        exit 0
    fi
    echo "fuzz: cargo-fuzz installed in $((SECONDS - start)) s"
fi

if ! cargo fuzz build --sanitizer "$sanitizer"; then
    [[ "$sanitizer" != none ]] || exit 1
    echo "fuzz: build with --sanitizer $sanitizer failed; retrying without a sanitizer"
    sanitizer=none
    bootstrap=""
    cargo fuzz build --sanitizer "$sanitizer"
fi

logs=target/fuzz-logs
mkdir -p "$logs"
for target in "${targets[@]}"; do
    corpus="corpus/$target"
    mkdir -p "$corpus"
    # Hand-picked seeds (committed) join the corpus kept between runs (ignored by git).
    for seed in "seeds/$target"/*; do
        if [[ -f "$seed" && ! -e "$corpus/${seed##*/}" ]]; then
            cp "$seed" "$corpus/"
        fi
    done
    log="$logs/$target.log"
    # -timeout: one input taking 10 s is a hang (inputs are sized to take milliseconds).
    status=0
    # FUZZ_SEED and FUZZ_RUNS make a run repeatable (CI's smoke run uses both): the same seed, corpus and
    # number of executions explore the same inputs every time.
    extra=()
    [[ -z "${FUZZ_SEED:-}" ]] || extra+=("-seed=$FUZZ_SEED")
    [[ -z "${FUZZ_RUNS:-}" ]] || extra+=("-runs=$FUZZ_RUNS")
    cargo fuzz run --sanitizer "$sanitizer" "$target" "$corpus" -- \
        -max_total_time="$per_target" -timeout=10 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    # A crash ends the run before the final stats: take the last progress line's count instead.
    [[ -n "$runs" ]] || runs=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    corpus_size=$(find "$corpus" -type f | wc -l)
    artifact=$(sed -n "s/.*Test unit written to \(.*\)$/\1/p" "$log" | tail -n 1)
    if ((status == 0)); then
        # libFuzzer's rate is executions over whole seconds: 0 when the run took less than one.
        [[ "$rate" != 0 ]] && pace="${rate:-?}/s" || pace="in under a second"
        echo "fuzz: $target: ok, ${runs:-?} executions (at most ${per_target} s; $pace), corpus $corpus_size inputs"
        continue
    fi
    failed+=("$target")
    echo "fuzz: $target: FAILED after ${runs:-?} executions (exit $status); log: fuzz/$log"
    grep -m 1 -A 4 "panicked at" "$log" || grep -m 3 -E "^(==[0-9]+== ?ERROR|SUMMARY)" "$log" || tail -n 20 "$log"
    if [[ -n "$artifact" ]]; then
        rel="${artifact#"$PWD"/}"
        echo "fuzz: reproduce with:  cd fuzz && ${bootstrap}cargo fuzz run --sanitizer $sanitizer $target $rel"
        if [[ "$target" == core_ops ]]; then
            echo "fuzz:   (with FUZZ_TRACE=1 in front, it prints the input's calls to the core as Rust)"
        fi
        echo "fuzz: minimize with:   cd fuzz && ${bootstrap}cargo fuzz tmin --sanitizer $sanitizer $target $rel"
    fi
done

if ((${#failed[@]} > 0)); then
    echo "fuzz: failing targets: ${failed[*]}"
    exit 1
fi
