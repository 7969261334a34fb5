"""SQLite: the FTS5 index no longer merges its segments in the writing transaction.

With FTS5's default `automerge`, the commit that adds a segment sometimes also merges a level of
them; on a 2M-message index that was 15-35 ms in the commit storing a send's user message, a
stall on the way to the first token every few sends (bench ttft). Merging is done instead right
after each reply's final write (chat/search/backends.py `search_index_tidy`), off that path;
`crisismerge` (16 segments on a level) still bounds the index if nothing tidies it.
PostgreSQL's trigram GIN index is untouched.
"""

from django.db import migrations

_FORWARD = "INSERT INTO chat_message_fts(chat_message_fts, rank) VALUES ('automerge', 0)"
# FTS5's default.
_REVERSE = "INSERT INTO chat_message_fts(chat_message_fts, rank) VALUES ('automerge', 4)"


def _run(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0007_message_search_owner"),
    ]

    operations = [
        migrations.RunPython(_run(_FORWARD), _run(_REVERSE), elidable=False),
    ]
