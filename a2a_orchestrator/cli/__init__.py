"""The `a2a-orchestrator` command line: its parser, its commands, its defaults."""
