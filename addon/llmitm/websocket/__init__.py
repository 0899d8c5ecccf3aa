"""Sans-IO: the Responses API over a WebSocket (Codex's default transport, openai-python's
``responses.connect()``) as a state machine — client messages in, client messages and HTTP
Responses calls out. The relay runs the calls; nothing here does I/O."""
