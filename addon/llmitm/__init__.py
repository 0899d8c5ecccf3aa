"""llmitm: an LLM-aware mitmproxy addon.

The package is split into a sans-IO core (``wire``, ``translate``) that knows the OpenAI wire
formats and never does I/O, and (in later layers) a thin mitmproxy shell.
"""

__version__ = "0.1.0"
