import sys

from relaybot.cli import main

sys.exit(main())
