"""The benchmark (`python -m launch.bench`, `python -m launch.bare`): the entries run,
their numbers read back, the bare loops that set the ceiling, the report.
"""
