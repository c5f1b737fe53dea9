"""The supported architectures, one file per family. Adding one is a new file and a line here."""

from __future__ import annotations

from . import bert, distilbert, modernbert
from .spec import ArchitectureSpec

ARCHITECTURES: dict[str, ArchitectureSpec] = {
    spec.model_type: spec for spec in (*bert.SPECS, *distilbert.SPECS, *modernbert.SPECS)
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(ARCHITECTURES)


def spec_for(model_type: str) -> ArchitectureSpec:
    """The spec of ``model_type``, or a ValueError that lists the supported ones."""
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"hf_sliced_attn does not support model_type {model_type!r}. "
            f"Supported architectures: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    return ARCHITECTURES[model_type]


__all__ = ["ARCHITECTURES", "SUPPORTED_MODEL_TYPES", "ArchitectureSpec", "spec_for"]
