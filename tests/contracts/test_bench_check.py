"""Benchmarks' verdicts gate: `--check` exits 1 when the last line's target_met is not true (or absent),
and every benchmark with a target takes the flag (`make bench` runs them with it)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from verdict import add_check, exit_code


def test_exit_code_is_the_verdict_only_when_asked() -> None:
    assert exit_code({"target_met": False}, check=True) == 1
    assert exit_code({"target_met": True}, check=True) == 0
    assert exit_code({}, check=True) == 1  # no verdict is not a pass
    assert exit_code({"target_met": "yes"}, check=True) == 1
    assert exit_code({"target_met": False}, check=False) == 0
    p = argparse.ArgumentParser()
    add_check(p)
    assert p.parse_args(["--check"]).check and not p.parse_args([]).check


def test_every_benchmark_with_a_target_takes_check_and_make_bench_uses_it() -> None:
    makefile = (ROOT / "Makefile").read_text()
    checked = re.search(r"^BENCH_CHECKED := (.+)$", makefile, re.MULTILINE)
    assert checked, "Makefile: BENCH_CHECKED"
    names = checked.group(1).split()
    with_target = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                         if '"target_met"' in p.read_text() and p.stem != "verdict")
    assert sorted(names) == with_target
    for name in names:
        assert "add_check(" in (ROOT / "benchmarks" / f"{name}.py").read_text(), name
    assert "--quick --check" in makefile


@pytest.mark.slow
def test_scaling_check_exits_1_on_a_trace_nothing_violates(tmp_path: Path) -> None:
    import subprocess

    # a step so small that the HPA never violates the SLO: the ratios are 0/0 and the target is not met
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--quick", "--seeds", "1",
                           "--service-ms", "0.01", "--check"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert '"target_met": false' in proc.stdout.strip().splitlines()[-1]
