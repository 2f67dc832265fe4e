"""The drift benchmark's corruption suite: 10 image families and 10 tabular families, 3 severities each.

Who calls it: benchmarks/drift.py (power of our detector against per-feature KS and MMD on the same
windows). Not in scanflow/: the detectors must not know a corruption, and nothing here is tuned to them.
Severities are mild on purpose (severity 1 is near the edge of what any test sees in 200 rows), so
the tests can be told apart; the S1 scenario's corruptions (workflows/digits/data.py) are far stronger.

Images: rows of 64 pixels in [0, 1] (8x8 digits); every function returns a corrupted copy of the window,
clipped to [0, 1]. Tabular: rows of the sensors workflow (column 0 a machine-type code, 9 numeric
sensor columns); `TAB_FAMILIES` take (window, severity, rng, pool) where `pool` is a large clean
labelled sample to draw re-weighted windows from (category and class mix).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

Array = np.ndarray
SEVERITIES = (1, 2, 3)
SIDE = 8


def _images(x: Array) -> Array:
    return x.reshape(-1, SIDE, SIDE)


def _warp(x: Array, theta: Array) -> Array:
    imgs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(-1, 1, SIDE, SIDE)
    with torch.inference_mode():
        grid = F.affine_grid(torch.from_numpy(theta.astype(np.float32)), list(imgs.shape), align_corners=False)
        out = F.grid_sample(imgs, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.reshape(len(x), -1).numpy()


def noise(x: Array, s: int, rng: np.random.Generator) -> Array:
    return x + rng.normal(0.0, (0.03, 0.06, 0.1)[s - 1], x.shape)


def blur(x: Array, s: int, rng: np.random.Generator) -> Array:
    """Mix each image with its 3x3 box blur (a defocused scanner)."""
    a = (0.15, 0.3, 0.6)[s - 1]
    p = np.pad(_images(x), ((0, 0), (1, 1), (1, 1)), mode="edge")
    box = np.mean([p[:, i:i + SIDE, j:j + SIDE] for i in range(3) for j in range(3)], axis=0)
    return ((1 - a) * _images(x) + a * box).reshape(x.shape)


def rotation(x: Array, s: int, rng: np.random.Generator) -> Array:
    deg = (3.0, 6.0, 12.0)[s - 1]
    ang = np.deg2rad(rng.uniform(deg / 2, deg, len(x)) * rng.choice([-1.0, 1.0], len(x)))
    theta = np.zeros((len(x), 2, 3))
    theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = np.cos(ang), -np.sin(ang), np.sin(ang), np.cos(ang)
    return _warp(x, theta)


def translation(x: Array, s: int, rng: np.random.Generator) -> Array:
    """The same sub-pixel shift for every image (a moved camera): 0.15 / 0.3 / 0.6 px to the right."""
    theta = np.zeros((len(x), 2, 3))
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = -(0.15, 0.3, 0.6)[s - 1] * 2.0 / SIDE
    return _warp(x, theta)


def occlusion(x: Array, s: int, rng: np.random.Generator) -> Array:
    """A 3x3 patch blanked at a random place in a share (0.1 / 0.2 / 0.4) of the images."""
    out = _images(x).copy()
    hit = np.flatnonzero(rng.random(len(x)) < (0.1, 0.2, 0.4)[s - 1])
    for i in hit:
        r, c = rng.integers(0, SIDE - 2, 2)
        out[i, r:r + 3, c:c + 3] = 0.0
    return out.reshape(x.shape)


def contrast(x: Array, s: int, rng: np.random.Generator) -> Array:
    g = (0.9, 0.8, 0.65)[s - 1]
    return 0.5 + g * (x - 0.5)


def brightness(x: Array, s: int, rng: np.random.Generator) -> Array:
    return x + (0.02, 0.04, 0.08)[s - 1]


def inversion(x: Array, s: int, rng: np.random.Generator) -> Array:
    """A share (0.02 / 0.05 / 0.1) of the images inverted (a scanner mode switched on some)."""
    out = x.copy()
    hit = rng.random(len(x)) < (0.02, 0.05, 0.1)[s - 1]
    out[hit] = 1.0 - out[hit]
    return out


def dropout(x: Array, s: int, rng: np.random.Generator) -> Array:
    """A share (0.02 / 0.05 / 0.1) of all pixels read 0 (dead sensor cells, random per image)."""
    return np.where(rng.random(x.shape) < (0.02, 0.05, 0.1)[s - 1], 0.0, x)


def gamma(x: Array, s: int, rng: np.random.Generator) -> Array:
    """A new tone curve: x ** g (g 0.85 / 0.7 / 0.5: grey ink darker)."""
    return np.power(np.clip(x, 0.0, 1.0), (0.85, 0.7, 0.5)[s - 1])


IMAGE_FAMILIES: dict[str, Callable[[Array, int, np.random.Generator], Array]] = {
    "noise": noise, "blur": blur, "rotation": rotation, "translation": translation, "occlusion": occlusion,
    "contrast": contrast, "brightness": brightness, "inversion": inversion, "dropout": dropout, "gamma": gamma,
}


def corrupt_image(x: Array, family: str, s: int, rng: np.random.Generator) -> Array:
    return np.clip(IMAGE_FAMILIES[family](np.asarray(x, dtype=np.float32), s, rng), 0.0, 1.0).astype(np.float32)


# -- tabular (the sensors workflow's rows) ---------------------------------------------------------------
def _reweighted(pool_x: Array, pool_y: Array, n: int, rng: np.random.Generator, key: Array, target: int,
                share: float) -> Array:
    """n rows drawn from the pool with `key == target` rows taking `share` more of the window than they do
    in the pool (the rest keep their relative shares)."""
    base = float(np.mean(key == target))
    want = min(0.95, base + share)
    w = np.where(key == target, want / base, (1 - want) / (1 - base))
    return pool_x[rng.choice(len(pool_x), n, p=w / w.sum())]


def t_shift(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    out = x.copy()
    out[:, 1] += (0.15, 0.3, 0.6)[s - 1] * sd[1]  # one sensor (temperature) reads high
    return out


def t_rescale(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    out, m = x.copy(), pool[0][:, 5].mean()
    out[:, 5] = m + (1.1, 1.2, 1.4)[s - 1] * (out[:, 5] - m)  # one sensor's gain changed about its mean
    return out


def t_all_shift(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    out = x.copy()
    out[:, 1:] += (0.05, 0.1, 0.2)[s - 1] * sd[1:]  # every sensor a little high
    return out


def t_category(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    return _reweighted(pool[0], pool[1], len(x), rng, pool[0][:, 0], 3, (0.05, 0.1, 0.2)[s - 1])


def t_classmix(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    return _reweighted(pool[0], pool[1], len(x), rng, pool[1], 2, (0.05, 0.1, 0.2)[s - 1])  # more overheating


def t_imputed(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    """Missing readings filled with the column's mean (a share 0.1 / 0.2 / 0.4 of two columns)."""
    out = x.copy()
    for c in (3, 8):
        hit = rng.random(len(x)) < (0.1, 0.2, 0.4)[s - 1]
        out[hit, c] = pool[0][:, c].mean()
    return out


def t_clipping(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    """A sensor saturating at its reference quantile 0.95 / 0.85 / 0.7 (both ends)."""
    out, q = x.copy(), (0.95, 0.85, 0.7)[s - 1]
    lo, hi = np.quantile(pool[0][:, 2], [1 - q, q])
    out[:, 2] = np.clip(out[:, 2], lo, hi)
    return out


def t_decorrelate(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    """Temperature shuffled across a share (0.2 / 0.4 / 0.8) of the rows: marginals unchanged, its link to
    load and machine type broken (a sensor wired to the wrong machine)."""
    out = x.copy()
    hit = np.flatnonzero(rng.random(len(x)) < (0.2, 0.4, 0.8)[s - 1])
    out[hit, 1] = out[rng.permutation(hit), 1]
    return out


def t_noise(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    out = x.copy()
    out[:, 1:] += rng.normal(0.0, 1.0, (len(x), x.shape[1] - 1)) * (0.2, 0.35, 0.6)[s - 1] * sd[1:]
    return out


def t_recalibration(x: Array, s: int, rng: np.random.Generator, pool: tuple[Array, Array], sd: Array) -> Array:
    from scanflow.examples.sensors.data import recalibrate

    return recalibrate(x, (0.02, 0.04, 0.08)[s - 1])  # the S1 maintenance visit, a few % of its size


TAB_FAMILIES: dict[str, Callable[..., Array]] = {
    "shift": t_shift, "rescale": t_rescale, "all_shift": t_all_shift, "category_mix": t_category,
    "class_mix": t_classmix, "imputed": t_imputed, "clipping": t_clipping, "decorrelate": t_decorrelate,
    "noise": t_noise, "recalibration": t_recalibration,
}


def corrupt_table(x: Array, family: str, s: int, rng: np.random.Generator, pool: tuple[Array, Array]) -> Array:
    sd = pool[0].std(axis=0)
    return np.asarray(TAB_FAMILIES[family](np.asarray(x, dtype=np.float32), s, rng, pool, sd), dtype=np.float32)
