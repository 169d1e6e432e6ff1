"""specdeploy: serve an LLM target and its speculative-decoding draft as one versioned pair."""

__version__ = "0.1.0"

GROUP = "specdeploy.dev"
VERSION = "v1alpha1"
