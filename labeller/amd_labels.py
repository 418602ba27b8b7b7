"""AMD labels, following AMD's k8s-node-labeller. PLACEHOLDER: being written."""

from __future__ import annotations

from labeller.labels import Labeler

LABELERS: tuple[Labeler, ...] = ()
