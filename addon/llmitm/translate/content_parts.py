"""Message content parts across the two APIs.

Owns the part-level mapping of request content: Responses ``input_text`` / ``output_text`` /
``input_image`` / ``input_file`` / ``input_audio`` parts ⇄ chat ``text`` / ``image_url`` /
``file`` / ``input_audio`` parts, and flattening text-only content to a string. Message- and
item-level decisions (roles, tool calls) belong to the request mappers.
"""

from __future__ import annotations

from typing import Any

from llmitm.translate.errors import TranslationError

TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})

# Separators for flattening text parts. Prose blocks (system prompts, user turns) get a
# paragraph break so sentences from different parts do not run together; assistant text and
# tool output are one stream split arbitrarily, where any inserted character would corrupt
# the data (a JSON document split over two parts).
BLOCK_SEPARATOR = "\n\n"
STREAM_SEPARATOR = ""


def _invalid_part(where: str, what: str) -> TranslationError:
    return TranslationError(
        f"{where} {what}; send text, image, file or audio content parts.",
        param=where,
        code="invalid_value",
    )


def _part_type(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise _invalid_part(where, "is not a content part object with a type")
    return kind


def is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES


def part_text(part: dict[str, Any]) -> str:
    text = part.get("text")
    return text if isinstance(text, str) else ""


def join_text(parts: list[dict[str, Any]], separator: str) -> str:
    return separator.join(part_text(part) for part in parts if is_text_part(part))


def responses_part_to_chat(part: Any, where: str, warnings: list[str]) -> dict[str, Any] | None:
    """The chat content part for one Responses input part (``None``: dropped, warned)."""
    kind = _part_type(part, where)
    if kind in TEXT_PART_TYPES:
        return {"type": "text", "text": part_text(part)}
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, str) and url:
            image: dict[str, Any] = {"url": url}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
        if isinstance(part.get("file_id"), str):
            # Chat image parts take only a URL; an uploaded file is referenced as a file part.
            return {"type": "file", "file": {"file_id": part["file_id"]}}
        raise _invalid_part(where, "is an input_image without image_url or file_id")
    if kind == "input_file":
        file = {
            key: part[key]
            for key in ("file_data", "file_id", "filename")
            if part.get(key) is not None
        }
        if "file_data" in file or "file_id" in file:
            return {"type": "file", "file": file}
        warnings.append(f"dropped {where}: chat file parts take file_data or file_id, not file_url")
        return None
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    raise _invalid_part(where, f"has unsupported type {kind!r}")


def chat_part_to_responses(part: Any, where: str) -> dict[str, Any]:
    """The Responses input part for one chat content part of a user/system/developer message."""
    kind = _part_type(part, where)
    if kind == "text":
        return {"type": "input_text", "text": part_text(part)}
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise _invalid_part(where, "is an image_url part without a url")
        detail = image.get("detail") if isinstance(image, dict) else None
        # Responses requires detail; "auto" is the default both APIs document.
        return {"type": "input_image", "image_url": url, "detail": detail or "auto"}
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, dict):
            raise _invalid_part(where, "is a file part without a file object")
        result: dict[str, Any] = {"type": "input_file"}
        for key in ("file_data", "file_id", "filename"):
            if file.get(key) is not None:
                result[key] = file[key]
        return result
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio")}
    raise _invalid_part(where, f"has unsupported type {kind!r}")


def chat_text_content(content: Any, where: str, separator: str) -> str:
    """Text of chat content that may only hold text (system, tool, assistant messages)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError(
            f"{where} must be a string or an array of text parts.",
            param=where,
            code="invalid_value",
        )
    for index, part in enumerate(content):
        kind = _part_type(part, f"{where}[{index}]")
        if kind != "text":
            raise TranslationError(
                f"{where}[{index}] has type {kind!r} but this message takes only text parts; "
                "send the text or move the media to a user message.",
                param=f"{where}[{index}]",
                code="invalid_value",
            )
    return join_text(content, separator)
