"""Test tooling that ships with llmitm: the pytest plugin (``llmitm.testing.pytest_plugin``, the
``llmitm`` fixture, registered through the ``pytest11`` entry point) and a deterministic fake
OpenAI-compatible upstream (``llmitm.testing.fake_upstream``, also ``python -m`` runnable).

Nothing is imported here, so loading the plugin does not load the fake upstream or the
reverse."""
