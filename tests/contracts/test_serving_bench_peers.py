"""benchmarks/serving.py's choice of each peer's number: the best configuration of each server, at
each concurrency the ratios use (pure; the benchmark itself runs with `make bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import PRESCREEN, finalists
from serving_peers import MLSERVER_BATCHING, mlserver_name


def point(rps: float, p99: float) -> dict[str, float]:
    return {"rps": rps, "p99_ms": p99}


def test_each_server_keeps_its_best_configuration_at_each_concurrency() -> None:
    assert PRESCREEN == (8, 64)
    pre = {"mlflow_w1": {8: point(300, 40), 64: point(320, 300)},
           "mlflow_w2": {8: point(500, 30), 64: point(520, 200)},
           "mlserver_pw0": {8: point(800, 12), 64: point(700, 120)},
           "mlserver_pw0_b32_5ms": {8: point(600, 20), 64: point(1500, 60)},  # batching wins only loaded
           "ray_r2": {8: point(400, 30), 64: point(450, 200)},
           "ray_b2": {8: point(400, 25), 64: point(440, 210)}}  # a tie at 8: the lower p99 wins
    family = {n: n.split("_")[0] for n in pre}
    assert finalists(pre, family) == ["mlflow_w2", "mlserver_pw0", "mlserver_pw0_b32_5ms", "ray_b2", "ray_r2"]


def test_the_mlserver_sweep_has_batching_off_and_on() -> None:
    names = [mlserver_name(*c) for c in MLSERVER_BATCHING]
    assert "mlserver_pw0" in names and "mlserver_pw2" in names
    assert any("_b" in n for n in names) and len(set(names)) == len(names)
