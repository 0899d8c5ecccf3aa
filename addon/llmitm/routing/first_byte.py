"""The first-byte bound of a directly forwarded call: its limit, and what ends it.

On a relayed route the failover job waits ``first_byte_timeout`` for an endpoint's answer
(``relay.failover``); on the direct path mitmproxy waits for the head itself. Both meet the
same limit (the route's ``first_byte_timeout``, else the ``[routing]`` default) and, when it
passes, end the same way: the attempt is a ``timeout`` for the endpoint's health, and the
client gets the 504 ``upstream_timeout`` error the failover job sends when every attempt
timed out (:func:`~llmitm.routing.attempts.attempts_error`, attempts list included).

Pure: the route, the times and the endpoint's name in, values out.
"""

from __future__ import annotations

from llmitm.routing.attempts import AttemptLog, AttemptsError, attempts_error
from llmitm.routing.config import Config, Route
from llmitm.routing.outcomes import Outcome


def first_byte_limit(config: Config, route: Route) -> float:
    """Seconds the route's upstream has to send its answer's head."""
    if route.first_byte_timeout is not None:
        return route.first_byte_timeout
    return config.routing.first_byte_timeout


def first_byte_message(limit: float) -> str:
    """Why the attempt ended (the failover job's words for the same ending)."""
    return f"no first byte within {limit:g} s"


def first_byte_outcome(message: str) -> Outcome:
    """What health learns: a timeout, before anything reached the client."""
    return Outcome("timeout", message=message)


def first_byte_error(
    endpoint: str, message: str, started: float, ended: float, model: str | None = None
) -> AttemptsError:
    """The client's answer: one timed-out attempt, as the failover job reports it."""
    log = AttemptLog(started=started)
    log.add(endpoint, first_byte_outcome(message), started, ended, model)
    return attempts_error(log)
