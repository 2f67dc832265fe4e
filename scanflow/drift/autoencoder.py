"""A small convolutional autoencoder in torch for 8x8x1 images, and how to train and score it.

Who calls it: `AutoencoderDriftDetector` (scanflow/drift/detector.py) trains one on the reference
data and asks it for per-sample reconstruction errors and encoder outputs. Ours, in torch, because
alibi-detect's autoencoder detectors need TensorFlow.

Torch is global state (thread count, RNG): `torch_threads` sets the thread count for one block and
puts it back, and `train_autoencoder` seeds its own generator, so a fit is deterministic and does
not disturb a serving process that shares the interpreter.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

IMAGE_SIDE = 8


class ConvAutoencoder(nn.Module):
    """8x8x1 -> conv(32, stride 2) -> latent -> dense 256 -> sigmoid 8x8x1.

    Sized for a cheap forward pass: one strided convolution in, dense layers out (~1 ms of CPU for
    500 rows). Full-resolution convolutions and a transposed convolution cost ~20 ms per 500 rows
    on one core (measured: the transposed convolution alone 13 ms), four times the drift budget.
    """

    def __init__(self, latent_dim: int = 16) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, latent_dim),
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, 256),
            nn.ReLU(),
            nn.Linear(256, IMAGE_SIDE * IMAGE_SIDE),
            nn.Sigmoid(),
            nn.Unflatten(1, (1, IMAGE_SIDE, IMAGE_SIDE)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def default_threads() -> int:
    """Threads for fitting and scoring: the cores this process may use, at most 4 (tiny model)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with `n` torch intra-op threads, then restore the previous count."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def to_images(x: NDArray[np.float32]) -> torch.Tensor:
    """(n, 64) float array -> (n, 1, 8, 8) float32 tensor (no copy when already float32)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.reshape(-1, 1, IMAGE_SIDE, IMAGE_SIDE)


def train_autoencoder(
    x: NDArray[np.float32],
    *,
    latent_dim: int = 16,
    epochs: int = 40,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 1e-5,
    seed: int = 0,
) -> ConvAutoencoder:
    """Train a ConvAutoencoder on `x` (n, 64) with Adam on mean squared error; returns it in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # layer initialisation uses the global generator
    model = ConvAutoencoder(latent_dim)
    data = to_images(x)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
    loss_fn = nn.MSELoss()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(data), generator=gen)
        for start in range(0, len(data), batch_size):
            batch = data[perm[start : start + batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(batch), batch)
            loss.backward()
            opt.step()
        sched.step()
    model.eval()
    return model


@torch.inference_mode()
def reconstruction_errors(model: ConvAutoencoder, x: NDArray[np.float32]) -> NDArray[np.float64]:
    """Per-sample mean squared reconstruction error, shape (n,)."""
    data = to_images(x)
    err = (model(data) - data).pow(2).mean(dim=(1, 2, 3))
    return err.double().numpy()


@torch.inference_mode()
def encode(model: ConvAutoencoder, x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Encoder outputs (n, latent_dim)."""
    return model.encoder(to_images(x)).numpy()
