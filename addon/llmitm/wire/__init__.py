"""Sans-IO wire formats: SSE framing, ids, usage and error shapes of the two OpenAI APIs."""
