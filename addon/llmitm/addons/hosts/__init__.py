"""What runs a mitmproxy master with llmitm's addons, rather than being one of them: mitmdump's
entry with the addons in place (:mod:`.entry`), the in-process master of the pytest plugin
(:mod:`.inprocess`), the ``-s`` script (:mod:`.mitmproxy_script`) and the export of recordings
as a mitmproxy flow file (:mod:`.flowfile`)."""
