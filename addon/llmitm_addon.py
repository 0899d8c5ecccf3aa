"""mitmdump -s addon/llmitm_addon.py: llmitm's addons for mitmdump, mitmproxy and mitmweb."""

from llmitm.addons import make_addons

addons = make_addons()
