"""A native Responses server's answer as llmitm stores it when it keeps the server's state
(an endpoint's ``state`` emulated; the request it was sent is
:func:`llmitm.translate.stateless.stateless_request`).

``background`` is not run by llmitm over a native server: the call completes in the
request, and the stored answer serves the client's polling (``GET``) as a finished one.
"""

from __future__ import annotations

from typing import Any


def stored_native_response(
    response: dict[str, Any], previous_response_id: str | None
) -> dict[str, Any]:
    """A native server's Response as llmitm stores it for ``GET``: with the state fields the
    client sent and the server never saw."""
    return dict(response, store=True, previous_response_id=previous_response_id)
