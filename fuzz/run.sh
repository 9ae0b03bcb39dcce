#!/usr/bin/env bash
# Fuzz every target (or the ones named) for SECONDS each (default 30) with cargo-fuzz, then
# print per target: executions per second, coverage (libFuzzer's `cov:` edge count) after the
# seed corpus and at the end, and the working corpus size.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`, about 3 minutes to build on 2 cores).
# Toolchain: nightly with AddressSanitizer when a nightly toolchain is installed (FUZZ_TOOLCHAIN,
# default `nightly`); otherwise the default toolchain with `--sanitizer none` (libFuzzer's
# coverage guidance works on stable; only the sanitizer needs nightly). FUZZ_SANITIZER
# overrides the sanitizer (address, none, ...).
#
# Inputs: the committed seeds in fuzz/corpus/<target>/ are read, never written; new inputs go
# to a working corpus in fuzz/target/corpus/<target>/ (ignored by git), kept between runs.
# A crash is written to fuzz/artifacts/<target>/crash-<sha1>; commit it (after minimising it
# with `cargo fuzz tmin`) and `cargo test --test fuzz_corpus` replays it on stable.
# Exit status: non-zero if any target failed (crash, leak, timeout or build error).
set -uo pipefail
cd "$(dirname "$0")"

seconds=30
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    seconds=$1
    shift
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v -- '-fuzz$')
fi

toolchain=${FUZZ_TOOLCHAIN:-nightly}
sanitizer=${FUZZ_SANITIZER:-address}
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    echo "fuzz: no $toolchain toolchain; using the default one with --sanitizer none"
    toolchain=$(rustup show active-toolchain | cut -d' ' -f1)
    sanitizer=${FUZZ_SANITIZER:-none}
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz is not installed; run \`cargo install cargo-fuzz\`" >&2
    exit 2
fi

# The crate declares rust-version 1.99, newer than the toolchains here, and `cargo fuzz` has
# no --ignore-rust-version: a `cargo` wrapper first on PATH adds it to the `cargo build` and
# `cargo run` that cargo-fuzz starts (rustup's proxy behind it still honours +toolchain).
real_cargo=$(command -v cargo)
shim=$PWD/target/shim
mkdir -p "$shim" target/logs
cat >"$shim/cargo" <<SHIM
#!/usr/bin/env bash
case \${1-} in
build | run) exec "$real_cargo" "\$1" --ignore-rust-version "\${@:2}" ;;
esac
exec "$real_cargo" "\$@"
SHIM
chmod +x "$shim/cargo"
export PATH="$shim:$PATH"

status=0
summary=()
for t in "${targets[@]}"; do
    work=target/corpus/$t
    mkdir -p "$work" "corpus/$t"
    log=target/logs/$t.log
    extra=()
    [[ -f dict/$t.dict ]] && extra+=("-dict=dict/$t.dict")
    echo "==== $t: ${seconds}s ($toolchain, sanitizer $sanitizer), log $PWD/$log"
    cargo "+$toolchain" fuzz run --sanitizer "$sanitizer" "$t" "$work" "corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
    rc=$?
    grep -E '^(INFO: seed|#[0-9]+[[:space:]]+(INITED|DONE)|==[0-9]+==ERROR|SUMMARY|Done [0-9]+ runs)' \
        "$log" || true
    start=$(grep -m1 -oE 'INITED cov: [0-9]+' "$log" | grep -oE '[0-9]+$')
    end=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
    execs=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    size=$(find "$work" -type f | wc -l)
    line=$(printf '%-20s exit %-3s %9s exec/s %11s runs  cov %5s -> %-5s  corpus %s' \
        "$t" "$rc" "${execs:-?}" "${runs:-?}" "${start:-?}" "${end:-?}" "$size")
    if [[ $rc -ne 0 ]]; then
        status=1
        crash=$(grep -oE "artifacts/$t/[a-z]+-[0-9a-f]+" "$log" | tail -1)
        line+="  FAILED${crash:+: fuzz/$crash}"
        tail -40 "$log"
    fi
    echo "$line"
    summary+=("$line")
done
echo
echo "==== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit $status
