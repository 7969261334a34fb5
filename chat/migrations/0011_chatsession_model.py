"""ChatSession.model: the model a chat's replies go to ("" = the agent's, else the server's).

Plain `ALTER TABLE ... ADD COLUMN` with a constant default, on both backends: Django's own
AddField rebuilds the whole table on SQLite for a NOT NULL column, and the rebuild breaks the
message-search triggers that name chat_sessions (0007). The column keeps its database default
'' (harmless, and right for rows any raw insert makes)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0010_message_vectors_on_delete"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="chatsession",
                    name="model",
                    field=models.CharField(blank=True, default="", max_length=200),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE chat_sessions ADD COLUMN model varchar(200) NOT NULL DEFAULT ''",
                    "ALTER TABLE chat_sessions DROP COLUMN model",
                ),
            ],
        ),
    ]
