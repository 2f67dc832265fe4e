"""scanflow.standard builds the four reference agents' chain: the same as the digits workflow spells out."""

from __future__ import annotations

import pytest

from scanflow.standard import standard_agents


def test_standard_agents_equal_the_long_form_of_the_digits_workflow() -> None:
    from scanflow.examples.digits.workflow import workflow

    built = standard_agents("digits", copy_tolerance=0.04,
                            executor={"duplicate_tolerance": 0.04, "holdout_fraction": 0.3})
    assert [a.model_dump() for a in built] == [a.model_dump() for a in workflow.agents]


def test_options_change_what_they_name_only() -> None:
    agents = {a.role: a for a in standard_agents("svc", window=50, autoscale=False, retrain={"k": 3},
                                                 retrain_cooldown_s=120)}
    assert agents["tracker"].settings == {"service": "svc", "window": 50, "quick_window": 200}
    planner = agents["planner"]
    assert "autoscale" not in {s.name for s in planner.strategies}
    assert planner.settings["retrain"] == {"rule": "cusum", "false_alarms_per_day": 0.1, "cooldown_s": 600.0, "k": 3}
    retrain = next(s for s in planner.strategies if s.name == "retrain-on-drift")
    assert retrain.cooldown_s == 120 and "120" in retrain.constraint
    with pytest.raises(ValueError, match="window"):
        standard_agents("svc", window=0)
