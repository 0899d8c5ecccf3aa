"""Record and replay, the sans-IO part: match keys, replay pools, what a hit or a
miss answers, and the ``recordings/`` folder format. No mitmproxy, no database: the addons in
``addons/record/`` and the store's ``sqlite_recordings`` move these values in and out."""
