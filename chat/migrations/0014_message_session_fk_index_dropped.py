"""ChatMessage.session without an index of its own: chat_msg_session_id_idx (session_id, id)
leads with the same column and serves every lookup by session (the foreign key's checks and
cascades included), so the single-column index Django made for the foreign key only cost every
stored message one more B-tree to update, and the table its pages.

Dropped by name, not with AlterField: on SQLite AlterField rebuilds the whole table, which would
break the message-search triggers (0007) and drop the owner_id column Django does not know of.
The name is Django's for that index on both databases."""

from django.db import migrations, models

INDEX = "chat_messages_session_id_c5afc568"


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0013_chatsession_messages_version"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="chatmessage",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="chat.chatsession",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {INDEX}",
                    f"CREATE INDEX {INDEX} ON chat_messages (session_id)",
                ),
            ],
        ),
    ]
