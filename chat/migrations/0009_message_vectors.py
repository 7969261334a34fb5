"""Message vectors for semantic recall (off unless LLM_EMBEDDING_MODEL is set: then the table
stays empty). Plain columns on both vendors, no extension (docs/search.md). The foreign keys get
their ON DELETE in the next migration (on PostgreSQL they exist only once this one ends)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0008_message_search_merge_after_reply"),
    ]

    operations = [
        migrations.CreateModel(
            name="MessageVector",
            fields=[
                (
                    "message",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="vector",
                        serialize=False,
                        to="chat.chatmessage",
                    ),
                ),
                ("model", models.CharField(max_length=200)),
                ("embedding", models.BinaryField()),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="chat.chatsession",
                    ),
                ),
            ],
            options={
                "db_table": "chat_message_vectors",
                "indexes": [
                    models.Index(fields=["session", "message"], name="chat_msg_vector_session_idx")
                ],
            },
        ),
    ]
