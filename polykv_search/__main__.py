"""``python -m polykv_search``: the ``polykv-search`` command."""

import sys

try:
    from polykv_search.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing the CLI
    sys.stderr.write("interrupted\n")
    sys.exit(130)

sys.exit(main())
