import sys

from raygrpo.cli.app import main

sys.exit(main())
