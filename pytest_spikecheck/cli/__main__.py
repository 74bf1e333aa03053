import sys

from pytest_spikecheck.cli.commands import main

sys.exit(main())
