"""The options every reconstruction detector takes are declared once (`ReconstructionOptions`) and the
base constructor gives each its default: the two lists must name the same arguments, or an option
added to the base would be refused by the image and tabular detectors (or typed wrong)."""

from __future__ import annotations

import inspect
import typing

import pytest

from scanflow.drift import (
    AutoencoderDriftDetector,
    ReconstructionDriftDetector,
    ReconstructionOptions,
    TabularAutoencoderDriftDetector,
)


def test_the_typed_options_are_exactly_the_base_constructors_arguments() -> None:
    base = inspect.signature(ReconstructionDriftDetector.__init__).parameters
    declared = set(typing.get_type_hints(ReconstructionOptions))
    assert declared == set(base) - {"self", "n_features"}


def test_each_detector_passes_an_option_through_and_keeps_its_own_defaults() -> None:
    image = AutoencoderDriftDetector(fpr=0.01, epochs=3, seed=7)
    assert (image.fpr, image.epochs, image.seed) == (0.01, 3, 7)
    tabular = TabularAutoencoderDriftDetector(4)
    assert (tabular.epochs, tabular.lr) == (60, 1e-2)  # its own defaults, not the base's 30 / 3e-3
    assert TabularAutoencoderDriftDetector(4, lr=0.5).lr == 0.5


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="epoch"):
        TabularAutoencoderDriftDetector(4, epoch=5)
