"""The message vectors' foreign keys cascade in the database too (cadau/dbconstraints.py): a raw
delete of a session or a message is not refused by its vectors."""

from django.db import migrations

from cadau.dbconstraints import ForeignKeyOnDelete


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0009_message_vectors"),
    ]

    operations = [
        ForeignKeyOnDelete(
            table="chat_message_vectors",
            foreign_keys=[
                ("message_id", "chat_messages", "CASCADE"),
                ("session_id", "chat_sessions", "CASCADE"),
            ],
        ),
    ]
