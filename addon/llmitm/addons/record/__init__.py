"""Record every LLM API flow, and replay recordings — ``llmitm_record`` and friends.

Only LLM API calls (:func:`llmitm.wire.paths.is_llm_call`) are recorded; other traffic through
the proxy is forwarded unrecorded unless ``llmitm_record_all`` is on.

Three addons, sharing one :class:`~llmitm.addons.record.flows.Capture` per flow:

- :class:`LlmFlowRecorder` (``recorder.py``, before the router) sees the client's request as
  sent, decides what is recorded or replayed and keeps the upstream's response before the
  translator replaces it; options are declared and parsed in ``options.py``.
- :class:`LlmRecordingsLoad` (``recordings.py``, after the store) loads the replay pool; the
  recordings folder and the replay report are written at shutdown.
- :class:`LlmRecordTap` (``tap.py``, after the translator) serves hits that wait for the
  router's plan, taps streams and, when the flow ends, has the record built
  (:mod:`llmitm.replay.capture`) on a worker thread (``builder.py``), off the event loop.

Answering from recordings — lookup, strict misses, drift, paced serving — is ``replay.py``.

Each recorded or replayed flow gets a :class:`~llmitm.wire.ids.Mint`: recording keeps the
ids, times and sealed reasoning the translation was handed; a replay through today's
translator hands them out again, so it re-makes the recorded answer byte for byte.

Modes: ``off``, ``record`` (default, into the store), ``rewrite`` (wipe each scope on its
first request, then record), ``once`` (replay a scope that has recordings, record one that
has none), ``replay-or-record`` (replay hits, record misses), ``replay`` (hits only; a miss is
a 400 and nothing ever goes upstream, also after every recording was used). Replay reads
``llmitm_recordings`` (a folder) when set, else the store; a recording mode with a folder
writes the folder at shutdown.
"""

from __future__ import annotations

from llmitm.addons.record.flows import Capture, recording_id, replay_hit
from llmitm.addons.record.recorder import LlmFlowRecorder
from llmitm.addons.record.recordings import LlmRecordingsLoad
from llmitm.addons.record.tap import LlmRecordTap

__all__ = [
    "Capture",
    "LlmFlowRecorder",
    "LlmRecordTap",
    "LlmRecordingsLoad",
    "recording_id",
    "replay_hit",
]
