"""`python -m microgpt.compare SWEEP`: the entry point of microgpt/commands/compare.py."""

import sys

from microgpt import entry

with entry.loading(__name__):  # OMP_WAIT_POLICY before torch loads; Ctrl-C meanwhile: one line
    from microgpt.commands.compare import main

if __name__ == "__main__":
    sys.exit(main())
