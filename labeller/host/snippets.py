"""``labels --format selector|affinity``: a ready-to-paste ``nodeSelector`` or node affinity that
lands a pod on nodes like this one: each vendor's presence label and model label (the
``accelerator``-style selection by model); with a minimum memory, a ``Gt`` on NVIDIA's numeric
``gpu.memory`` instead of the model. Pure: labels in, YAML text out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labeller.base.errors import InputError

SNIPPET_FORMATS = ("selector", "affinity")
PRESENCE_KEYS = ("nvidia.com/gpu.present", "amd.com/gpu.present")
# The model of each vendor's GPUs, first key present wins (AMD: no product name on some VFs).
MODEL_KEYS = (("nvidia.com/gpu.product",), ("amd.com/gpu.product-name", "amd.com/gpu.device-id"))
NVIDIA_MEMORY = "nvidia.com/gpu.memory"  # MiB, an integer: Gt compares it
AMD_VRAM = "amd.com/gpu.vram"  # "192G": text, which Gt cannot compare


class SnippetError(InputError, ValueError):
    """The snippet asked for cannot describe this node (one line)."""


def _model_keys(labels: Mapping[str, str]) -> list[str]:
    return [next(k for k in keys if k in labels) for keys in MODEL_KEYS if any(k in labels for k in keys)]


def _selected(labels: Mapping[str, str]) -> dict[str, str]:
    keys = [k for k in PRESENCE_KEYS if k in labels] + _model_keys(labels)
    if not keys:
        raise SnippetError("this node has no GPU labels to select on")
    return {k: labels[k] for k in keys}


def _vram_mib(value: str) -> int | None:
    return int(value[:-1]) * 1024 if value.endswith("G") and value[:-1].isdigit() else None


def _amd_model_key(labels: Mapping[str, str]) -> str | None:
    return next((k for k in MODEL_KEYS[1] if k in labels), None)


def _memory_requirements(labels: Mapping[str, str], min_memory: int
                         ) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """The Gt requirement on NVIDIA's gpu.memory, the model keys it replaces, and a comment for
    people when AMD GPUs are selected by model instead."""
    amd_model = _amd_model_key(labels)
    if NVIDIA_MEMORY in labels:
        have = int(labels[NVIDIA_MEMORY])
        if have < min_memory:
            raise SnippetError(f"this node's NVIDIA GPUs have {have} MiB ({NVIDIA_MEMORY}), less than --min-memory "
                               f"{min_memory}: the affinity would not select it")
        comment = None if amd_model is None else (
            f"--min-memory applies to the NVIDIA GPUs ({NVIDIA_MEMORY}); the AMD GPUs are selected by model "
            f"({amd_model}): {AMD_VRAM} is text (e.g. 192G), which Gt cannot compare")
        # Gt is strict: "at least min_memory" is "greater than min_memory - 1".
        return ([{"key": NVIDIA_MEMORY, "operator": "Gt", "values": [str(min_memory - 1)]}], ["nvidia.com/gpu.product"],
                comment)
    vram = _vram_mib(labels.get(AMD_VRAM, ""))
    if vram is not None and vram < min_memory:
        raise SnippetError(f"this node's AMD GPUs have {labels[AMD_VRAM]} ({AMD_VRAM}), less than --min-memory "
                           f"{min_memory} MiB: the affinity would not select it")
    if vram is None:
        raise SnippetError(f"--min-memory needs {NVIDIA_MEMORY} (MiB) or {AMD_VRAM} on this node; it has neither")
    return [], [], f"{AMD_VRAM} is text (e.g. 192G), which Gt cannot compare: this selects the model instead"


def snippet(labels: Mapping[str, str], fmt: str, min_memory: int | None = None) -> str:
    import yaml  # only these formats need it

    selected = _selected(labels)
    if fmt == "selector":
        if min_memory is not None:
            raise SnippetError("--min-memory needs --format affinity: a nodeSelector cannot compare numbers")
        return yaml.safe_dump({"nodeSelector": selected}, sort_keys=False)
    extra, replaced, comment = _memory_requirements(labels, min_memory) if min_memory is not None else ([], [], None)
    expressions = [{"key": k, "operator": "In", "values": [v]} for k, v in selected.items() if k not in replaced]
    document = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions + extra}]}}}}
    text = yaml.safe_dump(document, sort_keys=False)
    return f"# {comment}\n{text}" if comment else text
