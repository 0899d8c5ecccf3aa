"""Every use of mitmproxy's internals, one module per patch: what llmitm changes or reads
inside mitmproxy beyond its public addon API, each behind a guarded import and a start-up
check that falls back to mitmproxy's public behaviour when the internal is not as expected."""
