"""Markers and small helpers shared by test modules (import from here, not
from conftest)."""

from __future__ import annotations

import importlib.util

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
needs_diffusers = pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers is not installed")
