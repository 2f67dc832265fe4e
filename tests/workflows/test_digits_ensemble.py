"""The training job's model is the logit average of several MLPs, merged into one plain MLP."""

from __future__ import annotations

import numpy as np
import pytest


def test_merged_model_answers_the_mean_of_its_members_logits() -> None:
    import torch
    from scanflow.examples.digits.model import build_model, fit
    from scanflow.examples.digits.train import average_logits

    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    members = [build_model(hidden=h, seed=i) for i, h in enumerate((8, 16, 8))]
    for i, m in enumerate(members):
        fit(m, x, y, epochs=2, seed=i)
    merged = average_logits(members)
    assert isinstance(merged, torch.nn.Sequential) and merged[0].out_features == 32
    xt = torch.from_numpy(x)
    with torch.inference_mode():
        mean = torch.stack([m(xt) for m in members]).mean(dim=0)
        assert torch.allclose(merged(xt), mean, atol=1e-5)
    before = [p.clone() for p in members[0].parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, members[0].parameters(), strict=True))


def test_average_logits_refuses_what_is_not_the_digits_mlp() -> None:
    import torch
    from scanflow.examples.digits.train import average_logits

    with pytest.raises(ValueError, match="at least one"):
        average_logits([])
    with pytest.raises(ValueError, match="Sequential"):
        average_logits([torch.nn.Sequential(torch.nn.Linear(64, 10))])


def test_train_model_merges_members_and_refuses_none() -> None:
    from scanflow.examples.digits.data import load_splits
    from scanflow.examples.digits.train import train_model

    s = load_splits(0)
    model, losses, val_acc = train_model(s, hidden=8, epochs=3, members=2)
    assert model[0].out_features == 16 and len(losses) == 3 and 0.0 < val_acc <= 1.0
    with pytest.raises(ValueError, match="members"):
        train_model(s, members=0)


def test_training_rows_add_one_drifted_copy_per_clean_row_only_when_there_are_critical_points() -> None:
    from scanflow.examples.digits.data import corrupt, load_splits
    from scanflow.examples.digits.train import training_rows

    s = load_splits(0)
    x, y, n = training_rows(s, None)
    assert n == 0 and len(x) == len(s.x_train)  # the first model: clean rows only
    drifted = corrupt(s.x_feedback[:60], "contrast", 2, rng=1)
    x, y, n = training_rows(s, (drifted, s.y_feedback[:60]))
    clean_n = len(s.x_train)
    assert n == clean_n and len(x) == 2 * clean_n + 60 and len(y) == len(x)
    assert np.array_equal(y[clean_n + 60:], s.y_train)  # each copy keeps its clean row's label
    copies = x[clean_n + 60:]
    assert copies.min() >= 0.0 and copies.max() <= 1.0
    # the copies look like the drift (washed out: values pulled towards the middle), not like clean rows
    assert copies.std() == pytest.approx(drifted.std(), rel=0.15) and copies.std() < 0.6 * s.x_train.std()
    x, _, n = training_rows(s, (drifted, s.y_feedback[:60]), adapt="none")
    assert n == 0 and len(x) == clean_n + 60
    with pytest.raises(ValueError, match="adapt"):
        training_rows(s, None, adapt="coral")
