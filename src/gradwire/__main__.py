import sys

from gradwire.cli import main

sys.exit(main())
