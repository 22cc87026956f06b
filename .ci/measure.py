"""Run a command; report seconds to its first byte on stdout, its wall time and the peak resident memory of
its largest process (`--max-rss-mib` fails the run above that). Its output is passed through."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="command")
    parser.add_argument("--max-rss-mib", type=float, default=None)
    parser.add_argument("--expect-stderr", default=None, help="fail unless stderr contains this text")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    begin = time.perf_counter()
    child = subprocess.Popen(args.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = child.stdout.read(1)
    first_byte = time.perf_counter() - begin
    rest = child.stdout.read()
    stderr = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)  # this child's own figures (and its descendants')
    code = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - begin
    rss = usage.ru_maxrss / 1024
    sys.stdout.write((first + rest).decode(errors="replace"))
    sys.stdout.write("".join(line.rsplit("\r", 1)[-1] + "\n" for line in stderr.splitlines()[-12:]))
    figures = f"first stdout byte {first_byte:.2f} s | wall {wall:.1f} s | peak RSS {rss:.0f} MiB"
    print(f"[{args.label}] exit {code} | {figures}")
    if code != 0:
        return code
    if args.expect_stderr and args.expect_stderr not in stderr:
        print(f"[{args.label}] FAILED: stderr lacks {args.expect_stderr!r}")
        return 1
    if args.max_rss_mib is not None and rss > args.max_rss_mib:
        print(f"[{args.label}] FAILED: peak RSS {rss:.0f} MiB exceeds {args.max_rss_mib:.0f} MiB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
