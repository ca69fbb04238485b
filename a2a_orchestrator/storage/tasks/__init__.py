"""A role server's A2A stores: its tasks and their push configs.

`sqlite` (our task store on one SQLite file, `SQLiteTaskStore`) over `rows`
(a task as rows: its head, each history message); `cluster` (a2a-sdk's
versioned store and event log replicas share, on SQLAlchemy's engine);
`push` (push notification configs); `observed` (the one wrapper that tells
listeners of every save, for either kind of task store).
"""

__all__: list[str] = []
