"""A stored response as rows, and rows back as a stored response: what every backend keeps
alike (``store.sqlite_responses``, ``store.postgres_responses`` own only their SQL).

Input items are kept without their ids (:func:`split_ids`; the ids go beside them as a JSON
list), so a history resent each turn shares its chunks; input item ids are found through
64-bit keys (:func:`id_key`). :func:`saved_rows` builds a batch's ``responses``,
``response_items`` and ``response_input_ids`` rows, :func:`records_of` reads ``responses``
rows back, :func:`lease_of` a background run's lease.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from llmitm.responses_api.records import ResponseSaved, RunLease, StoredResponse, split_id
from llmitm.store.content import Joined, Value
from llmitm.store.content_chunks import Puts
from llmitm.store.input_index import InputIndex

SEAL_KEY_NAME = "reasoning-seal"
"""The ``llmitm_secrets`` row of the key that seals reasoning (``responses_api.seal``)."""

RESPONSE_COLUMNS = (
    "id, response, input_items, previous_response_id, created_at, expires_at, credential, "
    "input_chunk, response_chunk"
)


def split_ids(items: list[dict[str, Any]]) -> tuple[list[str | None], list[dict[str, Any]]]:
    """Input items as their ids and the items without them; an item whose first key is not
    a string ``id`` keeps it and has ``None`` for id, so :func:`join_ids` restores each item
    as it was, key order included."""
    ids: list[str | None] = []
    bare: list[dict[str, Any]] = []
    for item in items:
        item_id, rest = split_id(item)
        ids.append(item_id)
        bare.append(rest)
    return ids, bare


def join_ids(ids: list[str | None], bare: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item if i is None else {"id": i, **item} for i, item in zip(ids, bare, strict=True)]


@functools.lru_cache(maxsize=8192)
def id_key(ident: str) -> int:
    """An id as the 64-bit key of ``response_input_ids`` (readers confirm hits by the id).
    Kept for the ids seen last: a resent history's items keep their ids, and each turn keys
    all of them again (a tenth of the digest's cost; ~70 µs a turn at 90 items)."""
    return int.from_bytes(
        hashlib.blake2b(ident.encode(), digest_size=8).digest(), "little", signed=True
    )


Serialised = tuple[list[str | None] | None, Value, bytes]

INPUT_LANE = "input_items"
RESPONSE_LANE = "response"
"""The lanes (``store.content.Bases``) of stored input items and Response objects."""


def serialised(record: StoredResponse, chunked: bool) -> Serialised:
    """A saved response's input items and Response object as JSON (``orjson``, at C speed:
    done at once, so that :func:`saved_rows` is weighed before it cuts them); with
    ``chunked``, the items without their ids, and the ids."""
    if not chunked:
        return None, orjson.dumps(record.input_items), orjson.dumps(record.response)
    made = record.input_json
    if made is not None and len(made) == len(record.input_items):
        # Each item's JSON made when it was new: a resent history is neither serialised nor
        # joined whole; the store copies the parts a turn adds (``store.content.Joined``).
        pieces = [b"["]
        for _, data in made:
            pieces += (data, b",")
        pieces[-1] = b"]" if made else b"[]"
        return [item_id for item_id, _ in made], Joined(pieces), orjson.dumps(record.response)
    ids, bare = split_ids(record.input_items)
    return ids, orjson.dumps(bare), orjson.dumps(record.response)


def saved_weight(serialised: list[Serialised], puts: Puts | None) -> int:
    """What cutting ``serialised`` (:func:`serialised` of a batch) weighs for
    ``store.content_chunks.cut``: the bytes its values add to their lanes; without ``puts``
    (nothing is cut), their length."""
    if puts is None:
        return sum(len(items) + len(response) for _, items, response in serialised)
    return sum(
        puts.unshared(INPUT_LANE, items) + puts.unshared(RESPONSE_LANE, response)
        for _, items, response in serialised
    )


def saved_rows(
    writes: Sequence[ResponseSaved],
    serialised: list[Serialised],
    puts: Puts | None,
    index: InputIndex,
) -> tuple[list[tuple[Any, ...]], list[tuple[str, str, bytes]], list[tuple[int, int]]]:
    """The ``responses``, ``response_items`` and ``response_input_ids`` rows of ``writes``
    (``serialised``: :func:`serialised` of each); with ``puts``, the Response object and the
    input items as chunks, output items only indexed (an empty ``item``: read from the
    response), input items by key, those ``index`` holds at an earlier response left out."""
    rows: list[tuple[Any, ...]] = []
    item_rows: list[tuple[str, str, bytes]] = []
    input_keys: list[tuple[int, int]] = []
    for w, (ids, items, response) in zip(writes, serialised, strict=True):
        record = w.record
        values: tuple[Any, ...]
        if puts is not None:
            input_chunk = puts.put(INPUT_LANE, items)
            response_chunk = puts.put(RESPONSE_LANE, response)
            key = id_key(record.id)
            values = (b"", orjson.dumps(ids), input_chunk, response_chunk, key)
            input_keys += index.rows(record, key, id_key)
            output = record.response.get("output")
            indexed = [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []
        else:
            values = (response, items)
            indexed = record.items()
        item_rows += [
            (item["id"], record.id, b"" if puts is not None else orjson.dumps(item))
            for item in indexed
            if isinstance(item.get("id"), str)
        ]
        rows.append(
            (
                record.id,
                *values[:2],
                record.previous_response_id,
                record.created_at,
                record.expires_at,
                record.credential,
                *values[2:],
            )
        )
    return rows, item_rows, input_keys


LEASE_COLUMNS = "response_id, owner, heartbeat_at, cancel_requested_at, delete_requested"


def lease_of(row: Sequence[Any]) -> RunLease:
    cancel = float(row[3]) if row[3] is not None else None
    return RunLease(str(row[0]), str(row[1]), float(row[2]), cancel, bool(row[4]))


def chunk_names(rows: Sequence[Sequence[Any]]) -> list[bytes]:
    """The chunks the ``responses`` rows (``RESPONSE_COLUMNS``) keep their values in, in the
    order :func:`records_of` takes them."""
    return [bytes(n) for row in rows for n in row[7:9] if n is not None]


def records_of(rows: Sequence[Sequence[Any]], values: Iterator[bytes]) -> list[StoredResponse]:
    """``responses`` rows (``RESPONSE_COLUMNS``: id, response, input_items,
    previous_response_id, created_at, expires_at, credential, input_chunk, response_chunk) as
    records; ``values``: the contents of :func:`chunk_names`, read in order."""
    records = []
    for row in rows:
        rid, response, items, previous, created_at, expires_at, credential = row[:7]
        input_items = orjson.loads(items)
        if row[7] is not None:
            input_items = join_ids(input_items, orjson.loads(next(values)))
        if row[8] is not None:
            response = next(values)
        records.append(
            StoredResponse(
                id=str(rid),
                response=orjson.loads(response),
                input_items=input_items,
                previous_response_id=previous if isinstance(previous, str) else None,
                created_at=float(created_at),
                expires_at=float(expires_at) if expires_at is not None else None,
                credential=credential if isinstance(credential, str) else None,
            )
        )
    return records


def item_in(record: StoredResponse | None, item_id: str) -> dict[str, Any] | None:
    """The item of ``record`` (input or output) whose id is ``item_id``."""
    for item in record.items() if record else []:
        if item.get("id") == item_id:
            return item
    return None
