"""inferd: a GPU model-serving runtime with an embedded control plane."""

__version__ = "0.1.0"

# The name of the OpenAI-compatible API family in every chat path:
# `{url}/openai/v1/chat/completions` (the spec's `compat` segment).
COMPAT_FAMILY = "openai"
