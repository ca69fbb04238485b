"""The role server, shaped like a2a-sdk's server/: app, executor, handler, serving."""

__all__: list[str] = []
