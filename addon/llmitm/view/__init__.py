"""Sans-IO views of LLM traffic for people: the assembled conversation of a body or stream,
its plain-text and rich renderings, the live console's per-stream state, stream timelines."""
