"""The proofs: trainers run as users run them, and their results judged (parity, handoff,
version parity, the serving check, chaos), with the reference loop and the harness they
share. Test equipment: its reports may change shape; what it proves may not weaken.
"""
