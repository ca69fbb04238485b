"""Helpers the tests share: servers, processes, ports, CLI runners, sessions.

Test modules import from here (`from support.servers import role_server`),
never from one another, so each file runs alone too; `conftest.py` holds
only fixtures. tests/ is on pytest's `pythonpath` (pyproject), and a script
run from here by path (`crash/`) imports only the package.
"""
