import sys

from rftstack.cli import main

sys.exit(main())
