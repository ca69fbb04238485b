"""A role server's A2A stores: its tasks and their push configs.

`sqlite` (our task store on one SQLite file, `SQLiteTaskStore`) and
`postgres` (replicas' versioned store on PostgreSQL, `PgTaskStore`), both
over `rows` (a task as rows: its head, each history message, and the save
logic); `cluster` (the store and a2a-sdk's event log replicas share);
`push` (push notification configs); `observed` (the one wrapper that tells
listeners of every save, for either kind of task store).
"""

__all__: list[str] = []
