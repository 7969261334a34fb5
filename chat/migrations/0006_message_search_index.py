"""The message search index (chat/search/): substring search that works for Chinese and English
alike, without a word segmenter, on both databases.

- PostgreSQL: the pg_trgm extension and a GIN trigram index on message content.
- SQLite: an FTS5 table with the trigram tokenizer, over chat_messages as its external content,
  kept in step by triggers.

Both leave out replies still streaming: their text changes many times a second, and re-indexing
it on every progress save would cost the streaming path for rows no one searches yet. A reply is
indexed when it stops streaming.

Neither index is part of the model state (Django has no way to say "this index exists on one
vendor only"), so the operations are vendor-checked raw SQL with their exact reverse.
"""

from django.db import migrations

# The partial index's predicate: chat/search/backends.py repeats it in every query so PostgreSQL
# can prove the index applies.
_PG_FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    # chat/search/backends.py PostgresBackend.index_hits: `content ILIKE '%q%'` for q of 3+
    # characters, and the admin's message search.
    "CREATE INDEX IF NOT EXISTS chat_msg_content_trgm_idx ON chat_messages "
    "USING gin (content gin_trgm_ops) WHERE status <> 'streaming'",
]
_PG_REVERSE = ["DROP INDEX IF EXISTS chat_msg_content_trgm_idx"]

_SQLITE_FORWARD = [
    # chat/search/backends.py SqliteBackend.index_hits: MATCH on a quoted phrase of 3+
    # characters, walked in rowid (= message id) order.
    "CREATE VIRTUAL TABLE chat_message_fts USING fts5("
    "content, content='chat_messages', content_rowid='id', tokenize='trigram')",
    "INSERT INTO chat_message_fts(rowid, content) "
    "SELECT id, content FROM chat_messages WHERE status <> 'streaming'",
    # An external-content FTS5 table must be told the exact old text to forget a row; these
    # triggers are the only writers, so it always is.
    "CREATE TRIGGER chat_message_fts_ai AFTER INSERT ON chat_messages "
    "WHEN new.status <> 'streaming' BEGIN "
    "INSERT INTO chat_message_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER chat_message_fts_ad AFTER DELETE ON chat_messages "
    "WHEN old.status <> 'streaming' BEGIN "
    "INSERT INTO chat_message_fts(chat_message_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); END",
    # Only when the text or the streaming state changes: a save that touches other columns
    # (metadata, updated_at) does not re-index the message.
    "CREATE TRIGGER chat_message_fts_au AFTER UPDATE OF content, status ON chat_messages "
    "WHEN old.content IS NOT new.content OR old.status IS NOT new.status BEGIN "
    "INSERT INTO chat_message_fts(chat_message_fts, rowid, content) "
    "SELECT 'delete', old.id, old.content WHERE old.status <> 'streaming'; "
    "INSERT INTO chat_message_fts(rowid, content) "
    "SELECT new.id, new.content WHERE new.status <> 'streaming'; END",
]
_SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS chat_message_fts_au",
    "DROP TRIGGER IF EXISTS chat_message_fts_ad",
    "DROP TRIGGER IF EXISTS chat_message_fts_ai",
    "DROP TABLE IF EXISTS chat_message_fts",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, ()):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0005_db_on_delete"),
    ]

    operations = [
        migrations.RunPython(
            _run({"postgresql": _PG_FORWARD, "sqlite": _SQLITE_FORWARD}),
            _run({"postgresql": _PG_REVERSE, "sqlite": _SQLITE_REVERSE}),
            elidable=False,
        ),
    ]
