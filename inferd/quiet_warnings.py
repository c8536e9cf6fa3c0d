"""Warnings inferd's own setup makes true, dropped where they would mislead.

The CPU install removes PyPI's torchvision on purpose (it does not import
against the CPU torch, see scripts/install.sh). transformers then tells,
once per image-processor class, to "install torchvision"; it already falls
back to the PIL processors, which is what SDXL's pipelines use anyway. A
user following that advice would break the install. A leaf module: no
inferd imports, nothing done at import time.
"""

from __future__ import annotations

import logging

_TRANSFORMERS_IMPORTS_LOGGER = "transformers.utils.import_utils"
_FALLBACK_TEXT = "requires torchvision (not installed); falling back to"


class _DropTorchvisionFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _FALLBACK_TEXT not in record.getMessage()


def drop_torchvision_fallback_warning() -> None:
    """Idempotent; call before importing diffusers or transformers' image models."""
    logger = logging.getLogger(_TRANSFORMERS_IMPORTS_LOGGER)
    if not any(isinstance(f, _DropTorchvisionFallback) for f in logger.filters):
        logger.addFilter(_DropTorchvisionFallback())
