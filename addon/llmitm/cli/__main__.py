"""``python -m llmitm.cli``: the command line run as a module, without the console script."""

import sys

from llmitm.cli.main import main

sys.exit(main())
