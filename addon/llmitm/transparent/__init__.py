"""``llmitm run --transparent -- COMMAND``: a command in a network namespace of its own whose
outbound TCP and DNS are redirected to llmitm, for programs that ignore proxy variables.

``plan`` is the pure part (names, addresses, rules, file contents, which modes can wrap a
command); ``namespace`` builds and tears down the host side; ``inside`` is the small launcher
that enters the new namespaces and becomes the command; ``command`` ties them to the proxy.
"""
