"""ON DELETE at the database level for foreign keys whose deletion Django only emulates.

Django 5.2 implements `on_delete=CASCADE` and `SET_NULL` in the ORM: it deletes (or nulls) the
child rows itself and creates every foreign key with no action. A raw `DELETE FROM
chat_sessions` (an operator's psql session, a retention job in SQL, another service sharing the
database) then fails on the constraint. `ForeignKeyOnDelete` adds the action to the constraint
itself, per vendor, keeping the models' `on_delete` as it is. Cadau's own deletes of sessions
and messages are such raw statements too (chat/services/sessions.py): Django's collector read
every message id of a session to cascade to their vectors. `tests/test_db_on_delete.py`
checks that every relation under a session is listed here and that none has a delete signal:

- PostgreSQL: the constraint is dropped and added again with the same name (Django's schema
  editor finds foreign keys by column, not by name, so later migrations still find it), still
  DEFERRABLE INITIALLY DEFERRED as Django creates it. One ALTER TABLE, one transaction.
- SQLite cannot alter a constraint: the table is rebuilt from its own CREATE TABLE with the
  REFERENCES clause changed (SQLite's documented 12-step procedure; Django's migration schema
  editor has foreign-key enforcement off meanwhile). Indexes and triggers are created again,
  and the AUTOINCREMENT counter kept, so an id is never handed out twice.

Caveat, which `tests/test_db_on_delete.py` checks after all migrations: Django rebuilds a SQLite
table from the model state on an AlterField or RemoveField of it, and on PostgreSQL an
AlterField of the foreign key re-creates the constraint; either writes it back without the
action. A later migration doing that must end with this operation again.

A stable, importable module (as Django's own operations are) rather than code inside one
migration: two apps' migrations use it, and a migration must only rely on what it names here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db.migrations.operations.base import Operation

ACTIONS = ("CASCADE", "SET NULL")

#: (table, column, referenced table, action) for every foreign key that has its action in the
#: database: the session's and the agent's children, as their models' on_delete says.
DB_ON_DELETE: tuple[tuple[str, str, str, str], ...] = (
    ("chat_messages", "session_id", "chat_sessions", "CASCADE"),
    ("chat_context_snapshots", "session_id", "chat_sessions", "CASCADE"),
    ("agent_memory_flushes", "session_id", "chat_sessions", "CASCADE"),
    ("chat_sessions", "agent_id", "agents", "SET NULL"),
    ("agent_memory_flushes", "agent_id", "agents", "SET NULL"),
    ("chat_message_vectors", "message_id", "chat_messages", "CASCADE"),
    ("chat_message_vectors", "session_id", "chat_sessions", "CASCADE"),
)

ForeignKeys = Sequence[tuple[str, str, str | None]]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def references_rewrite(*, create_sql: str, column: str, to_table: str, action: str | None) -> str:
    """SQLite: `create_sql` with `column`'s REFERENCES clause given ON DELETE `action` (None: no
    action). Raises ValueError when the column's REFERENCES clause is not there exactly once."""
    pattern = re.compile(
        rf"({re.escape(_q(column))}[^,]*?REFERENCES\s+{re.escape(_q(to_table))}\s*\(\s*\"id\"\s*\))"
        r"(?:\s+ON\s+DELETE\s+(?:CASCADE|SET\s+NULL|SET\s+DEFAULT|RESTRICT|NO\s+ACTION))?",
        re.IGNORECASE,
    )
    suffix = f" ON DELETE {action}" if action else ""
    rewritten, count = pattern.subn(lambda m: m.group(1) + suffix, create_sql)
    if count != 1:
        raise ValueError(f"{column} REFERENCES {to_table}: found {count} times in {create_sql!r}")
    return rewritten


class ForeignKeyOnDelete(Operation):
    """Give `table`'s foreign keys `(column, referenced table, action)` their ON DELETE action
    in the database. Reversible: backwards, the keys go back to no action. Changes no model
    state (Django's `on_delete` stays what the model says)."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, *, table: str, foreign_keys: ForeignKeys) -> None:
        for _column, _to, action in foreign_keys:
            if action is not None and action not in ACTIONS:
                raise ValueError(f"unsupported ON DELETE action {action!r}")
        self.table = table
        self.foreign_keys: list[tuple[str, str, str | None]] = [
            (column, to_table, action) for column, to_table, action in foreign_keys
        ]

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (
            self.__class__.__qualname__,
            [],
            {"table": self.table, "foreign_keys": self.foreign_keys},
        )

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._apply(schema_editor, self.foreign_keys)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._apply(schema_editor, [(column, to, None) for column, to, _ in self.foreign_keys])

    def describe(self) -> str:
        keys = ", ".join(f"{c} ON DELETE {a or 'NO ACTION'}" for c, _t, a in self.foreign_keys)
        return f"Database-level ON DELETE on {self.table}: {keys}"

    def _apply(self, schema_editor: Any, foreign_keys: ForeignKeys) -> None:
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            for column, to_table, action in foreign_keys:
                _postgresql(schema_editor, self.table, column, to_table, action)
        elif vendor == "sqlite":
            _sqlite_rebuild(schema_editor, self.table, foreign_keys)
        # Other databases are not supported by Cadau; nothing to do.


def _postgresql(
    schema_editor: Any, table: str, column: str, to_table: str, action: str | None
) -> None:
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(cursor, table)
    names = [
        name
        for name, info in constraints.items()
        if info["foreign_key"] == (to_table, "id") and info["columns"] == [column]
    ]
    if len(names) != 1:
        raise ValueError(f"{table}.{column}: expected one foreign key to {to_table}, got {names}")
    name = _q(names[0])
    on_delete = f" ON DELETE {action}" if action else ""
    schema_editor.execute(
        f"ALTER TABLE {_q(table)} DROP CONSTRAINT {name}, "
        f'ADD CONSTRAINT {name} FOREIGN KEY ({_q(column)}) REFERENCES {_q(to_table)} ("id")'
        f"{on_delete} DEFERRABLE INITIALLY DEFERRED"
    )


def _sqlite_rebuild(schema_editor: Any, table: str, foreign_keys: ForeignKeys) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
        create_sql = cursor.fetchone()[0]
        cursor.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = %s AND type IN ('index', 'trigger') "
            "AND sql IS NOT NULL",
            [table],
        )
        others = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'"
        )
        sequence = None
        if cursor.fetchone()[0]:
            cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
            row = cursor.fetchone()
            sequence = row[0] if row else None
    new_sql = create_sql
    for column, to_table, action in foreign_keys:
        new_sql = references_rewrite(
            create_sql=new_sql, column=column, to_table=to_table, action=action
        )
    if new_sql == create_sql:
        return
    temporary = f"new__{table}"
    head = re.compile(
        rf"^\s*CREATE\s+TABLE\s+(?:{re.escape(_q(table))}|{re.escape(table)}\b)", re.IGNORECASE
    )
    new_sql, count = head.subn(f"CREATE TABLE {_q(temporary)}", new_sql, count=1)
    if count != 1:
        raise ValueError(f"cannot read the CREATE TABLE of {table}: {create_sql!r}")
    # Same columns in the same order (only a REFERENCES clause changed), so * copies them.
    # Table names are this module's constants, quoted as identifiers: no input reaches the SQL.
    for sql in (
        new_sql,
        f"INSERT INTO {_q(temporary)} SELECT * FROM {_q(table)}",  # noqa: S608
        f"DROP TABLE {_q(table)}",
        f"ALTER TABLE {_q(temporary)} RENAME TO {_q(table)}",
        *others,
    ):
        schema_editor.execute(sql, None)
    if sequence is not None:
        # The copy set the counter to the highest id left, or dropped it with an empty table;
        # rows deleted earlier had used ids above it, and AUTOINCREMENT never hands one out twice.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
            row = cursor.fetchone()
        keep = max(int(sequence), int(row[0]) if row else 0)
        schema_editor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
        schema_editor.execute(
            "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, keep]
        )
