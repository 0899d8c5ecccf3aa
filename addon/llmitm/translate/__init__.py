"""Sans-IO translation between the Chat Completions and Responses APIs.

Public surface:

- :func:`llmitm.translate.requests.chat_request_to_responses` /
  :func:`llmitm.translate.requests.responses_request_to_chat`
- :func:`llmitm.translate.bodies.chat_completion_to_response` /
  :func:`llmitm.translate.bodies.response_to_chat_completion`
- :class:`llmitm.translate.stream_to_chat.ResponsesToChatStream`,
  :class:`llmitm.translate.stream_to_responses.ChatToResponsesStream`,
  :class:`llmitm.translate.normalise.ResponsesNormaliser`
- :class:`llmitm.translate.pipeline.StreamPipeline` (bytes in, bytes out)
"""
