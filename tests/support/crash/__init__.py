"""Scripts run as subprocesses and killed at a chosen moment.

Each is run by path (`python .../support/crash/crash_parent.py ...`), see its docstring.
"""
