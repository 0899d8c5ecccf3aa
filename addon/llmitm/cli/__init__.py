"""The ``llmitm`` command line: parsing arguments and printing results; the work lives in the
core packages.

``main`` (the console script ``llmitm``) dispatches to one module per command: ``run``
(mitmdump with llmitm's addons, alone or around a command, whose environment
``command_env`` computes), ``translate``, ``usage`` and ``rec`` (a module per subcommand).
"""

from llmitm.cli.main import main

__all__ = ["main"]
