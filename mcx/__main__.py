import sys

from mcx.cli.main import main

sys.exit(main())
