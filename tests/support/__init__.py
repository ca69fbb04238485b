"""Helpers the tests share: servers, processes, ports, CLI runners, sessions.

Test modules import from here (`from support.servers import role_server`);
`conftest.py` holds only fixtures. tests/ is on sys.path (pytest puts the
root conftest's folder there), so `support` imports in every folder.
"""
