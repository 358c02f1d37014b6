"""python -m microgpt.heads RUN: see microgpt/commands/heads.py."""

import sys

from microgpt import entry

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    from microgpt.commands.heads import main

sys.exit(main())
