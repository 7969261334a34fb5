"""Development and test tools that are not part of the product: the fake OpenAI-compatible
LLM server (`devtools.fakellm`) and its `manage.py fakellm` command.

Layering: devtools may import `chat` (the fake speaks the product's summary marker and reuses
its offline summariser); nothing in `chat`, `agentmemory` or `cadau` imports devtools (the
import-linter contract in pyproject.toml, checked by tests/test_architecture.py).
"""
