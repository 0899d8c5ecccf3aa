"""Sans-IO wire formats: SSE framing, ids, usage and error shapes of the two OpenAI APIs, and
the credentials they carry (``redact``: what every recording, export and saved flow hides)."""
