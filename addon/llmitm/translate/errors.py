"""The one exception the translators raise: a request or body that cannot be expressed.

It carries what a client needs for a 400 in its own protocol; the proxy turns it into an
OpenAI-shaped error response and the CLI into a one-line message.
"""

from __future__ import annotations

from typing import Any

from llmitm.errors import InputError
from llmitm.wire.errors import ApiError, openai_error_body


class TranslationError(InputError):
    """The input cannot be translated faithfully."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "unsupported_parameter",
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status

    def to_api_error(self) -> ApiError:
        return ApiError(
            message=self.message,
            type="invalid_request_error",
            code=self.code,
            param=self.param,
            status=self.status,
        )

    def to_body(self) -> dict[str, Any]:
        return openai_error_body(self.to_api_error())
