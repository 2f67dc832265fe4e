"""`AutoencoderDriftDetector`: drift in images, from a convolutional autoencoder's reconstruction errors.

Who calls it: the Checker agent (through `scanflow.drift.fit_reference` / `load_detector` for image
schemas, or directly), the digits tests and benchmarks/drift.py. The decision, calibration and
persistence are `ReconstructionDriftDetector`'s (scanflow/drift/reconstruction.py); this class adds
what is particular to images: rows are flattened images of `image_shape`, scaled into [0, 1] by the
reference's global minimum and maximum (so 0-255 images train the sigmoid-output autoencoder like
[0, 1] ones), and the model is a strided-convolution encoder with a dense decoder sized from the shape.
"""

from __future__ import annotations

import math
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from scanflow.drift import ranges
from scanflow.drift.autoencoder import ConvAutoencoder
from scanflow.drift.base import Array
from scanflow.drift.options import ReconstructionOptions
from scanflow.drift.reconstruction import ReconstructionDriftDetector

__all__ = ["AutoencoderDriftDetector"]

MIN_SPAN = 1e-6  # a constant reference image keeps its scale: (x - lo) / max(hi - lo, MIN_SPAN)


class AutoencoderDriftDetector(ReconstructionDriftDetector):
    """Drift detector for images, rows of (n, prod(image_shape)) values, on a small torch autoencoder.

    image_shape: (H, W) or (C, H, W); (8, 8) by default, the digits the defaults were tuned on.
    latent_dim: width of the encoder output (and of what an alibi-detect backend compares).
    Other arguments: `ReconstructionDriftDetector`. Defaults fit ~1,000 8x8 rows in a few seconds.

    Inputs are scaled by the reference's global range, learnt in `fit`; until then (a detector whose
    `model` is set by hand, as benchmarks/drift.py does to share one autoencoder) the range is [0, 1].
    """

    name = "autoencoder"
    kind = "image"
    input_mean = True  # pixels share one scale: an image's mean intensity is evidence of its own

    def __init__(
        self,
        *,
        image_shape: tuple[int, ...] = (8, 8),
        latent_dim: int = 16,
        **options: Unpack[ReconstructionOptions],
    ) -> None:
        shape = tuple(int(d) for d in image_shape)
        if len(shape) not in (2, 3) or min(shape) < 1:
            raise ValueError(f"image_shape {image_shape!r}: expected (H, W) or (C, H, W) of positive sizes")
        if latent_dim < 1:
            raise ValueError(f"latent_dim must be >= 1, got {latent_dim}")
        super().__init__(n_features=math.prod(shape), **options)
        self.image_shape = shape
        self.latent_dim = int(latent_dim)
        self.input_range: tuple[float, float] = (0.0, 1.0)

    def _fit_inputs(self, x_ref: Array) -> None:
        self.input_range = (float(x_ref.min()), float(x_ref.max()))

    def _copy_scale(self, x: Array) -> NDArray[np.float64]:
        """Pixels are judged in their own units (one scale for every pixel: they share units, and a border
        pixel blank in most images would otherwise magnify read noise into a difference), so a
        `copy_tolerance` reads as it would to the team: "copies differ by at most 0.04 per pixel"."""
        return np.ones(self.n_features)

    def _ranges_of(self, x_ref: Array) -> ranges.FeatureRanges:
        """One range for every pixel: they share a scale, and a border pixel that is 0 in every reference
        image may carry noise in a drifted window (drift, not a schema violation)."""
        return ranges.learn_ranges(x_ref, margin=self.range_margin, shared=True)

    def _model_inputs(self, x: Array) -> Array:
        lo, hi = self.input_range
        if lo == 0.0 and hi == 1.0:
            return x  # already in [0, 1]: no copy
        return ((x - np.float32(lo)) / np.float32(max(hi - lo, MIN_SPAN))).astype(np.float32)

    def _build_model(self) -> ConvAutoencoder:
        return ConvAutoencoder(self.latent_dim, self.image_shape)

    def _input_state(self) -> dict[str, NDArray[Any]]:
        return {"input_range": np.asarray(self.input_range, dtype=np.float64)}

    def _restore_inputs(self, arrays: dict[str, NDArray[Any]]) -> None:
        lo, hi = (float(v) for v in arrays["input_range"])
        self.input_range = (lo, hi)

    def schema(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_features": self.n_features, "categorical": [],
                "image_shape": list(self.image_shape)}

    def config(self) -> dict[str, Any]:
        return {**super().config(), "image_shape": list(self.image_shape), "latent_dim": self.latent_dim}
