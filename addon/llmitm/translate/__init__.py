"""Sans-IO translation between the Chat Completions and Responses APIs.

Public surface:

- requests: :func:`llmitm.translate.request_to_chat.responses_request_to_chat`,
  :func:`llmitm.translate.request_to_responses.chat_request_to_responses`
- non-streamed bodies: :func:`llmitm.translate.body_to_chat.response_to_chat_completion`,
  :func:`llmitm.translate.body_to_responses.chat_completion_to_response`,
  :func:`llmitm.translate.error_bodies.translate_error_body`
- streams, one parsed event in, events out:
  :class:`llmitm.translate.stream_to_chat.ResponsesToChatStream`,
  :class:`llmitm.translate.stream_to_responses.ChatToResponsesStream`,
  :class:`llmitm.translate.normalise.ResponsesNormaliser`
- streams as bytes in, bytes out: :class:`llmitm.translate.pipeline.StreamPipeline`
- whole documents of a detected kind: :func:`llmitm.translate.document.translate_document`

Per-exchange facts travel in :class:`llmitm.translate.context.TranslationContext`; the one
exception raised for untranslatable input is :class:`llmitm.translate.errors.TranslationError`.
"""
