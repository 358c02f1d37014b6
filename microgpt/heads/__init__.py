"""What each attention head does and whether it matters: analyse() -> HeadReport (analyse), roles,
circuits and ablations, the report; `python -m microgpt.heads RUN` (command).
"""
