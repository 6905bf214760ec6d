#!/usr/bin/env python3
"""scripts/ctest_summary.py: ctest's output, with its list of the tests that did not run folded.

scripts/test pipes ctest through it, in the build directory. Every line passes as it comes, but
ctest's closing list ("The following tests did not run:", one line per test: 67 gpu tests on a
machine without a GPU) becomes a line per reason: the tests labelled gpu in one line, the other
skipped tests grouped by the reason they gave (GTEST_SKIP's message, read from ctest's
Testing/Temporary/LastTest.log), disabled tests counted. Standard library only.
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import textwrap

NOT_RUN = "The following tests did not run:"
ENTRY = re.compile(r"^\s*\d+ - (.+) \((\w[\w ]*)\)\s*$")


def skip_reasons(log_path):
    """Test name -> the reason it gave for skipping (the line after gtest's "...: Skipped")."""
    reasons, current = {}, None
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return reasons
    for i, line in enumerate(lines):
        m = re.match(r"^\d+/\d+ Test: (.+)$", line)
        if m:
            current = m.group(1)
        elif current and line.endswith(": Skipped") and i + 1 < len(lines) and current not in reasons:
            reasons[current] = lines[i + 1].strip() or "(no reason given)"
    return reasons


def gpu_tests():
    """The names of the tests labelled gpu (ctest -N -L gpu), empty when ctest cannot say."""
    try:
        out = subprocess.run(["ctest", "-N", "-L", "gpu"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {m.group(1) for m in re.finditer(r"Test\s+#\d+: (.+)", out)}


def summarize(entries):
    """Lines that stand for ctest's not-run list: entries are (name, status) pairs."""
    reasons = skip_reasons(os.path.join("Testing", "Temporary", "LastTest.log"))
    gpu = gpu_tests()
    plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"
    out = []
    gpu_skipped = [n for n, s in entries if s == "Skipped" and n in gpu]
    if gpu_skipped:
        [(common, count)] = collections.Counter(reasons.get(n, "no reason recorded") for n in gpu_skipped).most_common(1)
        said = f": {common}" if count == len(gpu_skipped) else f"; {count} said: {common}"
        out.append(f"Skipped: {plural(len(gpu_skipped), 'gpu test')}{said} (ctest -L gpu -V shows each one's reason)")
    by_reason = collections.defaultdict(list)
    for n, s in entries:
        if s == "Skipped" and n not in gpu:
            by_reason[reasons.get(n, "no reason recorded")].append(n)
    for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        out.append(f"Skipped: {plural(len(names), 'test')} ({names[0]}{', ...' if len(names) > 1 else ''}): {reason}")
    disabled = [n for n, s in entries if s == "Disabled"]
    if disabled:
        out.append(f"Disabled: {plural(len(disabled), 'test')} (DISABLED_ in the name), e.g. {disabled[0]}")
    out += [f"Not run ({s}): {n}" for n, s in entries if s not in ("Skipped", "Disabled")]
    return out


def main():
    width = min(shutil.get_terminal_size((100, 24)).columns, 100)  # COLUMNS, else the terminal's
    entries, in_list = [], False
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line.strip() == NOT_RUN:
            in_list = True
            continue
        if in_list:
            m = ENTRY.match(line)
            if m:
                entries.append((m.group(1), m.group(2)))
                continue
            in_list = False
        print(line, flush=True)
    if entries:
        for line in summarize(entries):
            print(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False), flush=True)


if __name__ == "__main__":
    main()
