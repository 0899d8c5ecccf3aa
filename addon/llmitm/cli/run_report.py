"""What ``llmitm run --replay`` makes of the proxy's replay report once the command is done:
the exit status and its gist on stderr (``replay_verdict``), and the report as JUnit XML at
``--junit`` (``write_junit``)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from llmitm.cli.run_args import RunArgs


def write_junit(args: RunArgs, report: Path) -> None:
    """The replay report as JUnit XML at ``--junit`` (nothing without it, or without a
    report: the proxy failed to start, which the exit status already says)."""
    if not args.junit or not args.replay or not report.is_file():
        return
    from llmitm.replay import folder as folder_format
    from llmitm.replay.junit import junit_xml
    from llmitm.store import folder as folder_files

    scopes: dict[str, int] = {}
    scope_of: dict[str, str] = {}
    try:
        for interaction in folder_files.read_folder(Path(args.replay)):
            scopes[interaction.scope] = scopes.get(interaction.scope, 0) + 1
            scope_of[interaction.id] = interaction.scope
    except folder_format.FolderError as exc:
        print(f"llmitm run: {exc}", file=sys.stderr)  # the report still lists the problems
    document = orjson.loads(report.read_bytes())
    data = junit_xml(document, scopes, scope_of, fail_on_unused=args.fail_on_unused)
    try:
        Path(args.junit).write_bytes(data)
    except OSError as exc:
        print(f"llmitm run: cannot write {args.junit}: {exc.strerror}", file=sys.stderr)


def replay_verdict(report: Path, status: int, *, fail_on_unused: bool) -> int:
    """The exit status of a replayed command: its own when it failed, else 1 on any miss,
    on drift refused by ``llmitm_strict_drift``, or (when asked) on an unused recording; the
    report's gist goes to stderr."""
    if not report.is_file():
        print("llmitm run: the proxy wrote no replay report", file=sys.stderr)
        return status or 1
    document = orjson.loads(report.read_bytes())
    misses, unused = document.get("misses", []), document.get("unused", [])
    refused = document.get("drift", []) if document.get("strict_drift") else []
    print(
        f"llmitm run: replay: {document.get('hits', 0)} hit(s), {len(misses)} miss(es), "
        f"{len(unused)} unused recording(s)",
        file=sys.stderr,
    )
    for miss in misses:
        print(
            f"  miss: {miss['request']} model={miss['model']} key={miss['key']} "
            f"scope={miss['scope']} ({miss['reason']}); closest {miss['closest']}",
            file=sys.stderr,
        )
    for drift in refused:
        print(f"  drift: {drift['id']} (llmitm_strict_drift)", file=sys.stderr)
    if fail_on_unused:
        for item in unused:
            print(f"  unused: {item['id']} {item['route']} scope={item['scope']}", file=sys.stderr)
    if status:
        return status
    return 1 if misses or refused or (fail_on_unused and unused) else 0
