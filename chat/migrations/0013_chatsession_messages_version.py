"""ChatSession.messages_version: moved by every change to stored messages (a truncation, an
admin edit or deletion), not by a compaction. Recall's kept archive rows are checked against it
(chat/search/archive_window.py).

Plain `ALTER TABLE ... ADD COLUMN` with a constant default, as 0011 and for the same reason:
Django's AddField rebuilds the whole table on SQLite for a NOT NULL column, and the rebuild
breaks the message-search triggers that name chat_sessions (0007). The check is the one
Django gives a PositiveIntegerField."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0012_generator_lease"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="chatsession",
                    name="messages_version",
                    field=models.PositiveIntegerField(default=0),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE chat_sessions ADD COLUMN messages_version integer NOT NULL "
                    "DEFAULT 0 CHECK (messages_version >= 0)",
                    "ALTER TABLE chat_sessions DROP COLUMN messages_version",
                ),
            ],
        ),
    ]
