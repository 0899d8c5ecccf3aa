"""The ``-s`` entry that ``llmitm run`` hands to mitmdump (the repo's addon/llmitm_addon.py is
the same three lines for users of plain mitmdump, mitmproxy and mitmweb)."""

from llmitm.addons import make_addons

addons = make_addons()
