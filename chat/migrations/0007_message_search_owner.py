"""Message search, second step (review of 0006):

- `chat_messages.owner_id`, the session owner's id copied onto each message, with an
  (owner_id, id) index. A search over all of one user's sessions filtered on
  `session_id IN (that user's sessions)` and walked the primary key newest first through every
  other user's messages: 264 ms to find the window of a user whose messages are not the newest,
  on 300k rows, and linear in the table. With the column it is an index range scan of the
  user's own messages. Sessions never change owner, so the copy never goes stale. A database
  trigger fills it on insert, whoever inserts (the ORM, bulk_create, raw SQL); Django does not
  know the column (no model field), so it never writes NULL over it from a stale instance.
- SQLite: the FTS5 table's external content is a view of the rows it indexes (not streaming),
  so FTS5's own `rebuild` and `integrity-check` agree with what the triggers keep (with the
  table itself as content, a reply streaming at that moment made integrity-check report a
  malformed index, and a rebuild indexed its half-written text).
"""

from django.db import migrations

_PG_FORWARD = [
    "ALTER TABLE chat_messages ADD COLUMN owner_id bigint NULL",
    "UPDATE chat_messages m SET owner_id = s.owner_id FROM chat_sessions s "
    "WHERE s.id = m.session_id",
    # chat/search/backends.py: the window scan and index search over one user's sessions.
    "CREATE INDEX chat_msg_owner_id_idx ON chat_messages (owner_id, id)",
    "CREATE FUNCTION chat_message_owner_fill() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN IF NEW.owner_id IS NULL THEN "
    "SELECT s.owner_id INTO NEW.owner_id FROM chat_sessions s WHERE s.id = NEW.session_id; "
    "END IF; RETURN NEW; END $$",
    "CREATE TRIGGER chat_message_owner_fill BEFORE INSERT ON chat_messages "
    "FOR EACH ROW EXECUTE FUNCTION chat_message_owner_fill()",
]
_PG_REVERSE = [
    "DROP TRIGGER IF EXISTS chat_message_owner_fill ON chat_messages",
    "DROP FUNCTION IF EXISTS chat_message_owner_fill()",
    "DROP INDEX IF EXISTS chat_msg_owner_id_idx",
    "ALTER TABLE chat_messages DROP COLUMN IF EXISTS owner_id",
]

_FTS_TRIGGERS = [
    "CREATE TRIGGER chat_message_fts_ai AFTER INSERT ON chat_messages "
    "WHEN new.status <> 'streaming' BEGIN "
    "INSERT INTO chat_message_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER chat_message_fts_ad AFTER DELETE ON chat_messages "
    "WHEN old.status <> 'streaming' BEGIN "
    "INSERT INTO chat_message_fts(chat_message_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); END",
    "CREATE TRIGGER chat_message_fts_au AFTER UPDATE OF content, status ON chat_messages "
    "WHEN old.content IS NOT new.content OR old.status IS NOT new.status BEGIN "
    "INSERT INTO chat_message_fts(chat_message_fts, rowid, content) "
    "SELECT 'delete', old.id, old.content WHERE old.status <> 'streaming'; "
    "INSERT INTO chat_message_fts(rowid, content) "
    "SELECT new.id, new.content WHERE new.status <> 'streaming'; END",
]
_FTS_DROP = [
    "DROP TRIGGER IF EXISTS chat_message_fts_au",
    "DROP TRIGGER IF EXISTS chat_message_fts_ad",
    "DROP TRIGGER IF EXISTS chat_message_fts_ai",
    "DROP TABLE IF EXISTS chat_message_fts",
]

_SQLITE_FORWARD = [
    "ALTER TABLE chat_messages ADD COLUMN owner_id bigint NULL",
    "UPDATE chat_messages SET owner_id = "
    "(SELECT s.owner_id FROM chat_sessions s WHERE s.id = chat_messages.session_id)",
    "CREATE INDEX chat_msg_owner_id_idx ON chat_messages (owner_id, id)",
    # SQLite triggers cannot change NEW: fill the row just inserted. It touches neither
    # content nor status, so the FTS triggers do not fire for it.
    "CREATE TRIGGER chat_message_owner_fill AFTER INSERT ON chat_messages "
    "WHEN new.owner_id IS NULL BEGIN "
    "UPDATE chat_messages SET owner_id = "
    "(SELECT s.owner_id FROM chat_sessions s WHERE s.id = new.session_id) "
    "WHERE id = new.id; END",
    *_FTS_DROP,
    "CREATE VIEW chat_messages_searchable AS "
    "SELECT id, content FROM chat_messages WHERE status <> 'streaming'",
    "CREATE VIRTUAL TABLE chat_message_fts USING fts5("
    "content, content='chat_messages_searchable', content_rowid='id', tokenize='trigram')",
    "INSERT INTO chat_message_fts(chat_message_fts) VALUES ('rebuild')",
    *_FTS_TRIGGERS,
]
_SQLITE_REVERSE = [
    *_FTS_DROP,
    "DROP VIEW IF EXISTS chat_messages_searchable",
    "CREATE VIRTUAL TABLE chat_message_fts USING fts5("
    "content, content='chat_messages', content_rowid='id', tokenize='trigram')",
    "INSERT INTO chat_message_fts(rowid, content) "
    "SELECT id, content FROM chat_messages WHERE status <> 'streaming'",
    *_FTS_TRIGGERS,
    "DROP TRIGGER IF EXISTS chat_message_owner_fill",
    "DROP INDEX IF EXISTS chat_msg_owner_id_idx",
    "ALTER TABLE chat_messages DROP COLUMN owner_id",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, ()):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0006_message_search_index"),
    ]

    operations = [
        migrations.RunPython(
            _run({"postgresql": _PG_FORWARD, "sqlite": _SQLITE_FORWARD}),
            _run({"postgresql": _PG_REVERSE, "sqlite": _SQLITE_REVERSE}),
            elidable=False,
        ),
    ]
