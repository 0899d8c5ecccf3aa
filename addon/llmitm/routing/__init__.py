"""Sans-IO routing: the configuration model and the per-request plan (which endpoint, which
URL, which credentials, which translation). No mitmproxy import, no I/O beyond reading the
configuration file and the environment once at start-up."""
