"""How often the delivery analysis promotes a worse challenger, and how many labelled rows a good one needs.

    .venv/bin/python benchmarks/delivery_analysis.py --quick [--check]   # ~1 min on 2 cores
    options: --deliveries N (per scenario), --seed-base N, --look N (labelled rows between looks)

Each scenario replays `--deliveries` simulated deliveries through the Planner's policy
(`scanflow.policies.delivery.decide`, the shipped `DeliveryConfig` with one stage, no minimum time), a
look every `--look` labelled rows, as a Planner ticking through a stage sees them, until a verdict or
`rows`:

- shadow (paired rows, both models answered each): the champion right on 95 % of rows; rows where only
  one of the two is right at the rates named;
- canary with no shadow before it (unpaired: each model its own rows, the challenger 20 % of them).

Keys (the last line, JSON): per scenario `promoted`, `rolled_back`, `undecided` (shares of deliveries)
and `median_rows` to the verdict; `false_promotion_rate` (the worst of the two at-the-margin scenarios:
a challenger exactly `margin` worse promoted), `equal_promoted` (shadow, an equal challenger, within
its row budget), and `target_met`: false promotions at most 1 - confidence and an equal challenger
promoted in at least 95 % of deliveries. Seeds: `--seed-base` + i (1000 by default: the unit tests use
20-29, the default `planned_labels` was chosen on 0 and 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[0]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verdict import add_check, exit_code

from scanflow.policies import delivery
from scanflow.policies.delivery import (
    DeliveryConfig,
    DeliveryContext,
    DeliveryState,
    LiveFigures,
    OutcomeSums,
    Stage,
)

CHAMPION_ACCURACY = 0.95


def config() -> DeliveryConfig:
    """The shipped analysis (margin, confidence, planned_labels), one stage that only waits for rows."""
    d = DeliveryConfig()
    return DeliveryConfig(stages=(Stage("shadow", 1.0, min_labelled=200, min_seconds=0.0, timeout_s=1e12),),
                          margin=d.margin, confidence=d.confidence, planned_labels=d.planned_labels)


def canary_config() -> DeliveryConfig:
    d = DeliveryConfig()
    return DeliveryConfig(stages=(Stage("canary", 0.2, min_labelled=200, min_seconds=0.0, timeout_s=1e12),),
                          margin=d.margin, confidence=d.confidence, planned_labels=d.planned_labels)


def replay(looks: list[LiveFigures], cfg: DeliveryConfig) -> tuple[str, int]:
    state = DeliveryState()
    for i, fig in enumerate(looks):
        d, state = delivery.decide(DeliveryContext(now=float(i), figures=fig, config=cfg, state=state))
        if d.action != "hold":
            return d.action, max(fig.paired.n, fig.challenger.n + fig.champion.n)
    return "undecided", 0


def shadow_looks(better: float, worse: float, rows: int, look: int, rng: np.random.Generator) -> list[LiveFigures]:
    u = rng.random(rows)
    d = np.where(u < better, 1.0, np.where(u < better + worse, -1.0, 0.0))
    cs, cs2 = np.cumsum(d), np.cumsum(d * d)
    return [LiveFigures(paired=OutcomeSums(n, float(cs[n - 1]), float(cs2[n - 1]))) for n in range(look, rows + 1, look)]


def canary_looks(gap: float, rows: int, look: int, rng: np.random.Generator) -> list[LiveFigures]:
    mine = rng.random(rows) < 0.2
    right = rng.random(rows) < np.where(mine, CHAMPION_ACCURACY + gap, CHAMPION_ACCURACY)
    ch_n, ch_s = np.cumsum(mine), np.cumsum(mine & right)
    cp_n, cp_s = np.cumsum(~mine), np.cumsum(~mine & right)
    out = []
    for n in range(look, rows + 1, look):  # scores are 0/1: the sum of squares is the sum
        out.append(LiveFigures(challenger=OutcomeSums(int(ch_n[n - 1]), float(ch_s[n - 1]), float(ch_s[n - 1])),
                               champion=OutcomeSums(int(cp_n[n - 1]), float(cp_s[n - 1]), float(cp_s[n - 1]))))
    return out


def scenario(name: str, make: Any, cfg: DeliveryConfig, deliveries: int, seed_base: int) -> dict[str, Any]:
    verdicts = [replay(make(np.random.default_rng(seed_base + i)), cfg) for i in range(deliveries)]
    share = {v: sum(1 for a, _ in verdicts if a == v) / deliveries for v in ("promote", "rollback", "undecided")}
    rows = [n for a, n in verdicts if a != "undecided"]
    return {"scenario": name, "promoted": round(share["promote"], 4), "rolled_back": round(share["rollback"], 4),
            "undecided": round(share["undecided"], 4), "median_rows": statistics.median(rows) if rows else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 deliveries per scenario (else 1000)")
    ap.add_argument("--deliveries", type=int, default=None)
    ap.add_argument("--seed-base", type=int, default=1000)
    ap.add_argument("--look", type=int, default=100)
    add_check(ap)
    a = ap.parse_args(argv)
    n = a.deliveries or (200 if a.quick else 1000)
    cfg, ccfg, look, m = config(), canary_config(), a.look, DeliveryConfig().margin
    t0 = time.monotonic()
    results = [
        scenario("shadow, worse by the margin", lambda r: shadow_looks(0.02, 0.02 + m, 20_000, look, r), cfg, n, a.seed_base),
        scenario("shadow, equal", lambda r: shadow_looks(0.03, 0.03, 8_000, look, r), cfg, n, a.seed_base + 10**5),
        scenario("shadow, 2 points better", lambda r: shadow_looks(0.04, 0.02, 8_000, look, r), cfg, n, a.seed_base + 2 * 10**5),
        scenario("shadow, 10 points worse", lambda r: shadow_looks(0.0, 0.10, 4_000, look, r), cfg, n, a.seed_base + 3 * 10**5),
        scenario("canary 20 %, worse by the margin", lambda r: canary_looks(-m, 60_000, 5 * look, r), ccfg, n, a.seed_base + 4 * 10**5),
        scenario("canary 20 %, equal", lambda r: canary_looks(0.0, 60_000, 5 * look, r), ccfg, n, a.seed_base + 5 * 10**5),
    ]
    for r in results:
        print(json.dumps(r))
    false_promotion = max(results[0]["promoted"], results[4]["promoted"])
    out = {"deliveries_per_scenario": n, "look_rows": look, "margin": m, "confidence": cfg.confidence,
           "planned_labels": cfg.planned_labels, "false_promotion_rate": false_promotion,
           "equal_promoted": results[1]["promoted"], "equal_median_rows": results[1]["median_rows"],
           "worse_10_points_rolled_back": results[3]["rolled_back"], "seconds": round(time.monotonic() - t0, 1),
           "target_met": false_promotion <= cfg.alpha and results[1]["promoted"] >= 0.95}
    print(json.dumps(out))
    return exit_code(out, a.check)


if __name__ == "__main__":
    raise SystemExit(main())
