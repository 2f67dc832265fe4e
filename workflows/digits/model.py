"""The digits classifier: a small torch MLP on (n, 64) pixel rows in [0, 1], 10 logits out.

Built from `torch.nn.Sequential` only, so a pickled model loads in any process that has torch
(inference replicas, containers) without importing this repository. Who calls it: the training job
(workflows/digits/train.py) and tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

N_FEATURES = 64
N_CLASSES = 10


def build_model(hidden: int = 64, seed: int = 0) -> Any:
    """A fresh MLP 64 -> hidden -> 10 (ReLU), deterministically initialised from `seed`."""
    import torch

    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(N_FEATURES, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, N_CLASSES),
    )


def fit(
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 30,
    batch_size: int = 128,
    lr: float = 1e-2,
    seed: int = 0,
) -> list[float]:
    """Train in place with Adam and cross-entropy; returns the mean loss per epoch.

    Runs on one intra-op thread (restored afterwards): with tensors this small, more threads only
    add synchronisation, and on a shared 2-core machine they made training 5-10x slower.
    """
    import torch

    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        losses = _epochs(model, xt, yt, opt, loss_fn, gen, epochs, batch_size)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return losses


def _epochs(
    model: Any, xt: Any, yt: Any, opt: Any, loss_fn: Any, gen: Any, epochs: int, batch_size: int
) -> list[float]:
    import torch

    losses = []
    for _ in range(epochs):
        perm = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for start in range(0, len(xt), batch_size):
            idx = perm[start:start + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(xt))
    return losses


def accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Share of rows whose argmax logit is the label."""
    import torch

    if len(x) == 0:
        raise ValueError("accuracy of an empty set is undefined")
    with torch.inference_mode():
        pred = model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).argmax(dim=1).numpy()
    return float((pred == np.asarray(y)).mean())
