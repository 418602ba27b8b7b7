"""NVIDIA labels, following GPU Feature Discovery. PLACEHOLDER: being written."""

from __future__ import annotations

from labeller.labels import Labeler

LABELERS: tuple[Labeler, ...] = ()
