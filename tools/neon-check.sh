#!/usr/bin/env bash
# The AArch64 kernels against the portable ones, bit for bit, without ARM hardware: tests/native/neon_check.c and
# the kernel sources cross-compiled for AArch64 (the dotprod and i8mm files with their own -march flags, as
# setup.py builds them), then run under qemu-user on three emulated CPUs:
#   max         sdot and smmla: every path (portable, neon, neon_dot, neon_i8mm); the library must pick neon_i8mm
#   cortex-a76  sdot, no smmla: the library must pick neon_dot
#   cortex-a53  neither: the library must fall back to plain neon
# and, on a non-AArch64 host, compares a digest of the portable path's results with a native build's.
# Exit status 0 when all pass; 77 (skipped) when aarch64-linux-gnu-gcc or qemu-aarch64 is missing
# (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user).
set -euo pipefail
cd "$(dirname "$0")/.."

ARM_CC=${CC_AARCH64:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
for tool in "$ARM_CC" "$QEMU"; do
    if ! command -v "$tool" > /dev/null; then
        echo "neon-check: skipped: $tool not found (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)"
        exit 77
    fi
done

src=src/verispec/kernels/csrc
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# the library's flags (setup.py), warnings as errors
flags=(-O2 -std=c11 -fno-strict-aliasing -ffp-contract=off -Wall -Wextra -Werror -I"$src")
objects=()
for file in "$src"/*.c tests/native/neon_check.c; do
    case $(basename "$file") in
        vsk_neon_dot.c | vsk_tiles_neon_dot.c) march=(-march=armv8.2-a+dotprod) ;;
        vsk_tiles_neon_i8mm.c) march=(-march=armv8.2-a+dotprod+i8mm) ;;
        *) march=() ;;
    esac
    object="$out/$(basename "${file%.c}").o"
    "$ARM_CC" "${flags[@]}" "${march[@]}" -c "$file" -o "$object"
    objects+=("$object")
done
"$ARM_CC" -static -o "$out/neon_check" "${objects[@]}" -lm -lpthread

status=0
for run in "max neon_i8mm" "cortex-a76 neon_dot" "cortex-a53 neon"; do
    set -- $run
    echo "== qemu-aarch64 -cpu $1 (expect $2)"
    "$QEMU" -cpu "$1" "$out/neon_check" "$2" || status=1
done
# the portable path across architectures: a build for this (non-AArch64) host must print the same digest of the
# portable results as the AArch64 build, so every NEON path gives the host's portable bits too
HOST_CC=${HOST_CC:-cc}
if [ "$(uname -m)" != aarch64 ] && command -v "$HOST_CC" > /dev/null; then
    mkdir "$out/host"
    host_objects=()
    for file in "$src"/*.c tests/native/neon_check.c; do
        object="$out/host/$(basename "${file%.c}").o"
        "$HOST_CC" -O1 -std=c11 -fno-strict-aliasing -ffp-contract=off -I"$src" -c "$file" -o "$object"
        host_objects+=("$object")
    done
    "$HOST_CC" -o "$out/host/neon_check" "${host_objects[@]}" -lm -lpthread
    host=$("$out/host/neon_check" --digest)
    arm=$("$QEMU" -cpu max "$out/neon_check" --digest)
    echo "== the portable path's digest: $(uname -m) ${host##* }, aarch64 ${arm##* }"
    [ "$host" = "$arm" ] || { echo "neon-check: the portable path differs between $(uname -m) and aarch64"; status=1; }
fi
[ $status -eq 0 ] && echo "neon-check: all passed" || echo "neon-check: FAILED"
exit $status
