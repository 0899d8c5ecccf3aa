"""Text a stream translator holds until the part it belongs to closes, kept in few objects.

A translated stream's answer arrives as many small deltas (a few characters each), and its
last events repeat the whole text, so the translator holds every delta until then. Each one
kept as a ``str`` of its own costs ~50 bytes of object header for those few characters: a
100-event answer held ~6 KiB, a 1,000-event one ~60 KiB, for the life of the stream and for
every stream open at once. :class:`HeldText` joins every :data:`RUN` deltas into one string
as it goes, so it holds the text and about one header per :data:`RUN` deltas; each character
is copied once more than before, never again.
"""

from __future__ import annotations

RUN = 16
"""Deltas joined into one string at a time."""


class HeldText:
    """The deltas of one part, in order; :meth:`text` is their concatenation."""

    __slots__ = ("_joined", "_run")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._run: list[str] = []

    def add(self, delta: str) -> None:
        run = self._run
        run.append(delta)
        if len(run) == RUN:
            self._joined.append("".join(run))
            run.clear()

    def text(self) -> str:
        if self._joined:
            return "".join(self._joined + self._run)
        return "".join(self._run)
