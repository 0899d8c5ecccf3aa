"""Plain mitmdump's baseline for scripts/bench_proxy.py: relay every response live, nothing else.

mitmdump -s scripts/bench_passthrough_addon.py --mode reverse:http://127.0.0.1:PORT
"""

from mitmproxy import http


def responseheaders(flow: http.HTTPFlow) -> None:
    flow.response.stream = True  # type: ignore[union-attr]
