"""Redaction and match keys of a growing conversation, in proportion to what a turn adds.

An agent resends its whole history on every turn. Redacting a request and keying it walks
every string of it in Python — milliseconds a turn at a few hundred KB, growing with the
turn. Such a body is an object whose bulk is one array of items (a Responses call's
``input``, a chat call's ``messages``) beside a few other fields, and a turn repeats the
last turn's items. :class:`RequestMemo` keeps, for each part of a body it has seen — each
item of that array and each other field, named by its exact JSON bytes — what redaction
made of it and, per :class:`~llmitm.replay.keys.KeyOptions`, its canonical form with the
volatile values it numbered. A part seen before costs a serialisation and a lookup; only a
turn's new parts are walked.

The results are :func:`~llmitm.wire.redact.redact_body`'s and
:func:`~llmitm.replay.keys.canonical_body`'s on the whole body, byte for byte (property
tests compare both paths on random growing conversations): each rule of redaction and of
the key's reduction applies to one field or one item at a time, except ignore paths that
name one item by its index (or drop the whole array), for which the memo declines and the
whole body is walked. Parts are named by their JSON bytes, not compared as Python values,
since ``True == 1``.

Numbering: a volatile value's placeholder counts by its first appearance in the whole
body, so a part's canonical form depends on the parts before it. A part keeps the values
it numbered, in order, with the numbers they got. Replayed into this body's numbering (the
calls a walk would make, in its order) they get numbers again; when those are the numbers
it had, the form kept is the form a walk would make, and otherwise the part is walked again.
A body that starts with the very parts the last turn's walk went through (its growing parse
hands them back) goes on from where that walk reached instead: its forms, its items' texts
in the key and the numbering after them (:class:`_Reached`), so a resent history is not
replayed item by item either.

Bounded (:class:`~llmitm.wire.bytes_lru.BytesLru`): the least recently used parts are
forgotten past :data:`BUDGET` bytes of JSON. A part redaction changes is never kept (its
bytes may hold a credential).
Thread-safe (one lock): the record builder's worker uses it, and so does a hook when a build
runs inline.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.replay.keys import (
    DROPPED_FIELDS,
    DROPPED_PATHS,
    ItemTexts,
    KeyOptions,
    Numbering,
    item_text,
    reduced,
    volatile_pattern,
    with_placeholders,
)
from llmitm.wire import depth
from llmitm.wire.bytes_lru import BytesLru
from llmitm.wire.growing import GrowingBodies, Grown
from llmitm.wire.redact import (
    PLACEHOLDER,
    may_hold_secret,
    redact_fields,
    redact_json,
    secret_field,
)

SEQUENCES = ("input", "messages")
"""The fields whose array is the conversation (the first one a body has is taken)."""
BUDGET = 24 * 2**20
"""Bytes the parts kept may hold, roughly: each its JSON bytes, and one with volatile values
or dropped fields also its canonical form (a part's text is the parsed body's otherwise)."""

_AS_IS = object()
"""A part's redaction or canonical form that is the part itself."""
_DROPPED = object()
"""A field's canonical form when the key's reduction drops it."""

Numbered = tuple[tuple[str, str, int], ...]


@dataclass(slots=True)
class _Part:
    """What one field or item came to."""

    data: bytes
    """Its JSON bytes (``orjson``'s spelling), for a kept part."""
    redacted: Any
    """:data:`_AS_IS` for a part redaction leaves as it is (the only ones kept)."""
    changed: bool
    """Redaction made a different value of it (``redact_json``'s verdict)."""
    named: bool
    """It holds a secret-named field with a string (``redact_fields``'s verdict)."""
    too_deep: bool
    keyed: dict[KeyOptions, _Keyed] = field(default_factory=dict)
    """Per key options: its canonical form and what it numbered."""

    def forms_cost(self) -> int:
        """Bytes its forms hold, roughly: a form of about its bytes' size per options whose
        form is not the part itself, and each item text kept."""
        forms = sum(k.form is not _AS_IS and k.form is not _DROPPED for k in self.keyed.values())
        texts = sum(len(k.text) for k in self.keyed.values() if k.text is not None)
        return len(self.data) * forms + texts


@dataclass(slots=True)
class _Keyed:
    """A part's canonical form under one set of key options."""

    form: Any
    """:data:`_AS_IS` (the part itself), :data:`_DROPPED`, or the form."""
    numbered: Numbered
    """The volatile values it numbered, in order, with their numbers."""
    text: bytes | None = None
    """An item's form as the key's text spells it (:func:`~llmitm.replay.keys.item_text`),
    made when first asked for."""


@dataclass(frozen=True, slots=True)
class Seen:
    """A body redacted and reduced, as the whole-body functions would have made them."""

    content: bytes
    """:func:`~llmitm.wire.redact.redact_body` of the body."""
    body: dict[str, Any]
    """The redacted body, parsed (``content`` parsed again is equal to it)."""
    canonical: Any
    """:func:`~llmitm.replay.keys.canonical_body` of ``body`` (``None``: no options given)."""
    item_texts: ItemTexts | None = None
    """The canonical conversation array's items as the key's text spells them (with
    ``canonical``), each kept with its part: the key's text is spliced from them."""


class RequestMemo:
    """The parts of recent bodies, by their JSON bytes, with what they came to."""

    def __init__(self, budget: int = BUDGET) -> None:
        self._parts: BytesLru[_Part] = BytesLru(budget)
        self._lock = threading.Lock()
        # The last turn's body, parsed: the next turn's is parsed where it differs only,
        # and its resent items come with their parts (nothing here changes what it parsed).
        self._bodies = GrowingBodies()

    def redact(self, content: bytes | None) -> bytes | None:
        """:func:`~llmitm.wire.redact.redact_body` of ``content``, or ``None`` when the memo
        does not take such a body (then the caller redacts it whole)."""
        seen = self.see(content, None)
        return None if seen is None else seen.content

    def see(self, content: bytes | None, options: KeyOptions | None) -> Seen | None:
        """``content`` redacted and, given ``options``, its canonical body; ``None`` when the
        memo does not take it: not a JSON object with one of :data:`SEQUENCES` as an array,
        nested too deep, or ``options`` with ignore paths it cannot apply per item."""
        if not content or content.lstrip()[:1] != b"{":
            return None
        try:
            grown = self._bodies.parse(content)
        except orjson.JSONDecodeError:
            return None
        body = grown.body
        sequence = next((name for name in SEQUENCES if isinstance(body.get(name), list)), None)
        if sequence is None or (options is not None and not _per_item(options, sequence)):
            return None
        with self._lock:
            layout: list[tuple[str, Any]] = [
                (name, self._items(name, value, grown))
                if name == sequence
                else (name, (value, self._part(name, False, value)))
                for name, value in body.items()
            ]
            parts = [p for _, v in layout for _, p in (v if isinstance(v, list) else [v])]
            if any(part.too_deep for part in parts):
                grown.forget()
                return None
            redacted = {
                name: [_redacted(*pair) for pair in value]
                if isinstance(value, list)
                else _redacted(*value)
                for name, value in layout
            }
            canonical, texts = None, None
            if options is not None:
                canonical, texts, reached = self._canonical(
                    layout, sequence, options, grown.carried
                )
                grown.carry(reached)
            self._parts.trim()
        changed = any(part.changed for part in parts)
        named = any(part.named for part in parts)
        if changed or named:
            grown.forget()  # its bytes may hold a credential: not kept past this body
        if changed != named and not (b"\\u" in content or may_hold_secret(content)):
            # redact_body tells a change by its copy's value when a string may hold a
            # credential and by a secret-named field's presence when none can; the two
            # disagree only where such a field holds the placeholder already.
            changed = named
        content = orjson.dumps(redacted) if changed else content
        return Seen(content, redacted, canonical, texts)

    def _items(self, name: str, items: list[Any], grown: Grown) -> list[tuple[Any, _Part]]:
        """Each item of the conversation array with its part: a resent item's is the part
        it had last turn (the same object, parsed from the same bytes), a new one's looked
        up or made."""
        kept = grown.previous if grown.name == name else None
        reused = grown.reused if kept is not None else 0
        pairs = list(zip(items[:reused], kept[:reused], strict=True)) if kept else []
        pairs += [(item, self._part(name, True, item)) for item in items[reused:]]
        grown.attach([part for _, part in pairs])
        return pairs

    def _part(self, name: str, item: bool, value: Any) -> _Part:
        try:
            data = orjson.dumps(value)
        except orjson.JSONEncodeError:
            # Nested past orjson's limit (255, where loads takes 1024): too deep for the memo,
            # whose caller then keys and redacts the body whole, by its bytes.
            return _Part(b"", value, False, False, True)
        part = self._parts.get((name, item), data)
        if part is not None:
            return part
        if item:
            redacted = redact_json(value)
            named = redact_fields(value) is not value
        else:
            named = secret_field(name, value)
            redacted = PLACEHOLDER if named else redact_json(value)
            named = named or redact_fields(value) is not value
        # The body is level 1 and the array level 2: an item starts at level 3.
        too_deep = depth.exceeds(value, depth.MAX_DEPTH - (2 if item else 1))
        changed = redacted != value
        if changed or named or too_deep:
            # Held a credential, maybe: nothing of it is kept past this body.
            return _Part(b"", redacted, changed, named, too_deep)
        part = _Part(data, _AS_IS, False, False, False)
        self._parts.put((name, item), data, part)
        return part

    def _canonical(
        self,
        layout: list[tuple[str, Any]],
        sequence: str,
        options: KeyOptions,
        earlier: Any,
    ) -> tuple[dict[str, Any], ItemTexts, _Reached]:
        """The canonical body, its items' texts, and how far the walk reached, going on
        from where ``earlier`` (the last turn's) reached when this body starts as it did."""
        numbering = Numbering()
        out: dict[str, Any] = {}
        before: list[_Part] = []
        reached: _Reached | None = None
        for name, value in layout:
            if not isinstance(value, list):
                form = self._form(*value, name, False, options, numbering)
                if form is not _DROPPED:
                    out[name] = form
                if reached is None:
                    before.append(value[1])
                continue
            parts = [part for _, part in value]
            forms: list[Any] = []
            texts: list[bytes] = []
            if isinstance(earlier, _Reached) and earlier.goes_on(options, before, parts):
                numbering = earlier.numbering()
                forms += earlier.forms
                texts += earlier.texts
            for item, part in value[len(forms) :]:
                form = self._form(item, part, sequence, True, options, numbering)
                forms.append(form)
                texts.append(self._text(part, sequence, options, form))
            out[name] = forms
            reached = _Reached(
                options,
                tuple(before),
                tuple(parts),
                tuple(forms),
                tuple(texts),
                dict(numbering.seen),
                dict(numbering.counts),
            )
        assert reached is not None  # the layout holds the sequence
        return out, ItemTexts(sequence, texts), reached

    def _text(self, part: _Part, name: str, options: KeyOptions, form: Any) -> bytes:
        """The text of an item's form (``part.keyed[options]``'s, just made or reused)."""
        keyed = part.keyed[options]
        if keyed.text is None:
            keyed.text = item_text(form)
            if part.redacted is _AS_IS:  # a kept part
                self._parts.charge((name, True), part.data, part.forms_cost())
        return keyed.text

    def _form(
        self,
        value: Any,
        part: _Part,
        name: str,
        item: bool,
        options: KeyOptions,
        numbering: Numbering,
    ) -> Any:
        kept = part.keyed.get(options)
        if kept is not None:
            form = kept.form
            same = True
            for kind, volatile, number in kept.numbered:  # every one: the walk's numbering
                same = numbering.number(kind, volatile) == number and same
            if same:
                return value if form is _AS_IS else form
        redacted = _redacted(value, part)
        whole = reduced({name: [redacted] if item else redacted}, options, True)
        if name not in whole:
            part.keyed[options] = _Keyed(_DROPPED, ())
            return _DROPPED
        form = whole[name][0] if item else whole[name]
        numbered: Numbered = ()
        if options.volatile:
            numbering.log = log = []
            form = with_placeholders(form, volatile_pattern(options), numbering)
            numbering.log = None
            numbered = tuple(log)
        if not numbered and part.redacted is _AS_IS and form == value:
            # The part itself (no volatile value, nothing dropped): next time, that body's
            # own copy serves, and nothing is held for it.
            part.keyed[options] = _Keyed(_AS_IS, ())
        else:
            part.keyed[options] = _Keyed(form, numbered)
        if part.redacted is _AS_IS:  # a kept part
            self._parts.charge((name, item), part.data, part.forms_cost())
        return form


@dataclass(frozen=True, slots=True)
class _Reached:
    """How far a body's canonical walk reached under ``options``: through the parts of the
    fields before its conversation array and those of its items, with the forms and texts
    they came to and the numbering after them. A part's form depends only on its bytes and
    the numbering it meets, so a body whose parts start with these same objects comes to
    the same forms and numbering there (none of it is changed: the next walk copies the
    numbering)."""

    options: KeyOptions
    before: tuple[_Part, ...]
    items: tuple[_Part, ...]
    forms: tuple[Any, ...]
    texts: tuple[bytes, ...]
    seen: dict[tuple[str, str], int]
    counts: dict[str, int]

    def goes_on(self, options: KeyOptions, before: list[_Part], items: list[_Part]) -> bool:
        """Whether a walk under ``options`` whose parts start with ``before`` (the fields
        before the array) and ``items`` reaches this far as this one did."""
        count = len(self.items)
        return (
            options == self.options
            and len(before) == len(self.before)
            and all(map(operator.is_, before, self.before))
            and len(items) >= count
            and all(map(operator.is_, items[:count], self.items))
        )

    def numbering(self) -> Numbering:
        """The numbering after the items, to go on with."""
        return Numbering(dict(self.seen), dict(self.counts))


def _redacted(value: Any, part: _Part) -> Any:
    """What redaction made of ``value``, whose part is ``part``."""
    return value if part.redacted is _AS_IS else part.redacted


def _per_item(options: KeyOptions, sequence: str) -> bool:
    """Whether the key's reduction under ``options`` treats each item of ``sequence`` on its
    own (``input.*.x`` does, ``input.0`` or ``input`` does not)."""
    if sequence in DROPPED_FIELDS[options.profile]:
        return False
    paths = [*DROPPED_PATHS[options.profile]]
    paths += [[part for part in path.split(".") if part] for path in options.ignore]
    return all(
        not parts or parts[0] not in (sequence, "*") or (len(parts) > 2 and parts[1] == "*")
        for parts in paths
    )
