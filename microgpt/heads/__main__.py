"""python -m microgpt.heads RUN: see microgpt/heads/command.py."""

import sys

from microgpt.heads.command import main

sys.exit(main())
