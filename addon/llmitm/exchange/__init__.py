"""Sans-IO handling of one proxied create call, per its routing plan: the upstream request
body, the translated non-streamed response, the stream pipeline. The mitmproxy addons only
move bytes between these functions and the flow."""
