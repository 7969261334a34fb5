"""LLM fixtures (the fake OpenAI-compatible server) land with the context-engine issue."""
