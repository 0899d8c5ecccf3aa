"""The relay: one loopback HTTP server owned by llmitm, through which mitmproxy fetches every
upstream response that llmitm must control while it streams.

mitmproxy cannot stream a body an addon makes, and when an upstream dies mid-stream it closes
the client's connection without a word. The relay fetches the upstream itself and always ends
its own response to mitmproxy cleanly, so the flow's stream callable sees the end and closes
the client's stream with a terminal error in the client's protocol. Later layers (failover,
paced replay, stored-response streaming) serve through the same relay.
"""
