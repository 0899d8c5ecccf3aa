"""The local Responses API: OpenAI's server state (``store``, ``previous_response_id``,
retrieve, delete, ``input_items``, ``background``, cancel, stream resume, reasoning
continuity) for Responses clients whose endpoint only speaks Chat Completions, or speaks
Responses but keeps no state.

Sans-IO like the translators: dicts and records in, answers and writes out. The records,
the writes and the reader the store implements are :mod:`.records`; the store is reached only
through a :class:`~.records.ResponseReader` (reads) and ``submit`` (writes), the upstream
only through an injected opener (:mod:`.background`). The mitmproxy
shell is three addons sharing ``llmitm.addons.responses_state``: ``responses_api`` (state
calls and create preparation), ``responses_writer`` (ids and what is stored) and
``background``.

- :mod:`.paths`: which requests are state calls (OpenAI and Azure forms), and their URL on
  the native endpoint that owns an id;
- :mod:`.create`: a create call before routing (references resolved, chain inlined,
  sealed reasoning restored) and what is remembered about it;
- :mod:`.stateless`: a native Responses server's answer as stored when llmitm keeps its state
  (an endpoint's ``state = "emulate"``);
- :mod:`.conversations`, :mod:`.conversation_records`: the Conversations API and its records;
- :mod:`.items`: input items with ids, the ``input_items`` list page;
- :mod:`.chain`: a stored ancestor chain → the conversation the next request continues;
- :mod:`.answers`: OpenAI's bodies and errors for retrieve, delete, list and cancel;
- :mod:`.seal`: reasoning sealed into ``encrypted_content`` and opened again;
- :mod:`.compaction`: ``compact`` and ``compaction_trigger`` answered by a summarisation call,
  the summary sealed into the ``compaction`` item and opened again;
- :mod:`.background`: a background response run by llmitm itself, resumable by sequence;
- :mod:`.takeover`: what a background call sends upstream, stores first and accounts last;
- :mod:`.scope`: whose stored state a request may read (its credential's, or everyone's).
"""
