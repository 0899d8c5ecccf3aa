"""The root of every exception llmitm raises on purpose, and the branches beneath it.

Each error is defined beside the code that raises it; this module owns only the tree, so any
layer may import it without pulling in another. Catch :class:`LlmitmError` for "llmitm said
no", a branch for one kind of no. Several errors also keep a builtin base (``ValueError``,
``RuntimeError``, ``ConnectionError``) that callers caught before the tree existed.

The tree (a test keeps it equal to the classes)::

    LlmitmError
    ├── InputError
    │   ├── TranslationError
    │   ├── UnreadableInput
    │   ├── PageError
    │   ├── CompactionError
    │   ├── RequestError
    │   ├── BadRequest
    │   ├── CacheRequestError
    │   └── _Refused
    ├── UserError
    │   ├── ConfigError
    │   ├── FolderError
    │   ├── PlanError
    │   ├── RecError
    │   ├── RunUsageError
    │   └── UsageError
    ├── TransportError
    │   ├── UpstreamError
    │   ├── UpstreamCut
    │   │   └── UpstreamStall
    │   ├── ReplayCut
    │   ├── ChunkError
    │   ├── IdleConnectionClosed
    │   └── StreamNotSent
    ├── StoreError
    │   ├── UnreadableDatabase
    │   ├── SchemaTooNew
    │   ├── StoreUnreachable
    │   └── FleetUnavailable
    └── HostError
        ├── InProcessError
        ├── NamespaceError
        └── SetupError
"""

from __future__ import annotations


class LlmitmError(Exception):
    """Something llmitm refused or could not do, with a message meant for a person."""


class InputError(LlmitmError):
    """A request, body or event from a client that llmitm cannot read, translate or serve;
    the client gets it as an error in its own protocol."""


class UserError(LlmitmError):
    """What the user asked for is wrong: a command line, a configuration file or a
    recordings folder. The message is one line for them."""


class TransportError(LlmitmError):
    """A connection to an upstream or a client failed, broke mid-body, or is ended on
    purpose."""


class StoreError(LlmitmError):
    """A database file that llmitm cannot read, or must not write; a shared database that
    does not answer."""


class HostError(LlmitmError):
    """The machine or process cannot host what was asked: an in-process proxy, a network
    namespace."""
