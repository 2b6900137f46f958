import sys

from polykv_search.cli import main

sys.exit(main())
