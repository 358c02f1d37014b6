"""python -m microgpt.heads RUN: see microgpt/heads/command.py."""

import sys

from microgpt import entry

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    from microgpt.heads.command import main

sys.exit(main())
