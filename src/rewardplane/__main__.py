import sys

from rewardplane.cli import main

sys.exit(main())
