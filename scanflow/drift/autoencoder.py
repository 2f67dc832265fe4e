"""Small torch autoencoders (convolutional for images, dense for tabular rows), and how to train and score them.

Who calls it: the reconstruction drift detectors (scanflow/drift/reconstruction.py and its subclasses)
build one sized from the reference's shape, train it on the reference rows and ask it for per-sample
reconstruction errors and encoder outputs. Ours, in torch, because alibi-detect's autoencoder detectors
need TensorFlow.

Every model here has `input_shape` (one sample's shape, without the batch dimension), an `encoder`
and a `decoder`; the functions below take rows already in the model's input space (scaled, encoded)
and reshape them to `(n, *input_shape)`.

Torch is global state (thread count, RNG): `torch_threads` sets the thread count for one block and
puts it back, and `train_autoencoder` seeds its own generator, so a fit is deterministic and does
not disturb a serving process that shares the interpreter.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

MAX_CONV_CELLS = 64  # strided convolutions are stacked until the feature map has at most this many cells
CONV_CHANNELS = 32


class Autoencoder(nn.Module):
    """What the detectors need of a model: `input_shape`, `encoder`, `decoder`; forward = decode(encode)."""

    input_shape: tuple[int, ...]
    encoder: nn.Module
    decoder: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def conv_layers(height: int, width: int) -> int:
    """How many stride-2 convolutions bring an (height, width) map to <= MAX_CONV_CELLS cells (at least 1)."""
    k = 1
    while math.ceil(height / 2**k) * math.ceil(width / 2**k) > MAX_CONV_CELLS and min(height, width) > 2**k:
        k += 1
    return k


class ConvAutoencoder(Autoencoder):
    """(C, H, W) -> k x [conv(32, stride 2), ReLU] -> latent -> dense -> sigmoid (C, H, W).

    k strided convolutions, as few as bring the map to <= 64 cells (one for 8x8 and 12x12, two for
    28x28); the decoder is dense, hidden width max(256, C*H*W / 2). Sized for a cheap forward pass: for
    8x8 (k = 1, hidden 256) ~1 ms of CPU for 500 rows. Full-resolution convolutions and a transposed
    convolution cost ~20 ms per 500 rows on one core (the transposed convolution alone 13 ms), four
    times the drift budget. Outputs are in [0, 1]: inputs are scaled there by the detector.
    """

    def __init__(self, latent_dim: int = 16, image_shape: tuple[int, ...] = (8, 8)) -> None:
        super().__init__()
        shape = tuple(int(d) for d in image_shape)
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3 or min(shape) < 1 or latent_dim < 1:
            raise ValueError(f"image_shape {image_shape!r}: expected (H, W) or (C, H, W) of positive sizes")
        channels, height, width = shape
        self.latent_dim = latent_dim
        self.input_shape = shape
        layers: list[nn.Module] = []
        h, w, c = height, width, channels
        for _ in range(conv_layers(height, width)):
            layers += [nn.Conv2d(c, CONV_CHANNELS, 3, stride=2, padding=1), nn.ReLU()]
            h, w, c = (h + 1) // 2, (w + 1) // 2, CONV_CHANNELS
        n_out = channels * height * width
        self.encoder = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * h * w, latent_dim))
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, max(256, n_out // 2)),
            nn.ReLU(),
            nn.Linear(max(256, n_out // 2), n_out),
            nn.Sigmoid(),
            nn.Unflatten(1, shape),
        )


class DenseAutoencoder(Autoencoder):
    """(d,) -> dense(hidden) -> ReLU -> latent -> dense(hidden) -> ReLU -> (d,), linear output.

    For standardised / one-hot tabular rows (unbounded, so no sigmoid). The latent must be narrower
    than d: an autoencoder as wide as its input learns the identity and reconstructs drifted rows as
    well as clean ones.
    """

    def __init__(self, width: int, *, hidden: int, latent_dim: int) -> None:
        super().__init__()
        if width < 1 or hidden < 1 or latent_dim < 1:
            raise ValueError(f"width {width}, hidden {hidden}, latent_dim {latent_dim}: all must be >= 1")
        self.input_shape = (width,)
        self.latent_dim = latent_dim
        self.encoder = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, latent_dim))
        self.decoder = nn.Sequential(nn.Linear(latent_dim, hidden), nn.ReLU(), nn.Linear(hidden, width))


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


def to_tensor(model: Autoencoder, x: NDArray[np.float32]) -> torch.Tensor:
    """(n, features) rows in the model's input space -> (n, *input_shape) float32 (no copy when float32)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.reshape(-1, *model.input_shape)


def train_autoencoder(
    model: Autoencoder,
    x: NDArray[np.float32],
    *,
    epochs: int = 40,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 1e-5,
    seed: int = 0,
) -> Autoencoder:
    """Train `model` on rows `x` (its input space) with Adam on mean squared error, cosine schedule.

    Seeded (batch order from its own generator); returns the model in eval mode. The caller seeds
    torch before building the model, since layer initialisation uses the global generator.
    """
    gen = torch.Generator().manual_seed(seed)
    data = to_tensor(model, x)
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
def reconstruction_errors(model: Autoencoder, x: NDArray[np.float32]) -> NDArray[np.float64]:
    """Per-sample mean squared reconstruction error over all input values, shape (n,)."""
    data = to_tensor(model, x)
    err = (model(data) - data).pow(2).flatten(1).mean(dim=1)
    return err.double().numpy()


@torch.inference_mode()
def errors_and_codes(model: Autoencoder, x: NDArray[np.float32]) -> tuple[NDArray[np.float64], NDArray[np.float32]]:
    """Per-sample reconstruction errors and encoder outputs (n, latent) from one forward pass."""
    data = to_tensor(model, x)
    codes = model.encoder(data)
    err = (model.decoder(codes) - data).pow(2).flatten(1).mean(dim=1)
    return err.double().numpy(), codes.flatten(1).numpy()


@torch.inference_mode()
def encode(model: Autoencoder, x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Encoder outputs (n, latent_dim)."""
    return model.encoder(to_tensor(model, x)).numpy()
