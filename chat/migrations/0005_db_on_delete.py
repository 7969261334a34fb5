"""ON DELETE in the database for the session's and the agent's children (cadau/dbconstraints.py):
a raw `DELETE FROM chat_sessions` deletes the session's messages and snapshots, and a raw
`DELETE FROM agents` leaves its sessions without an agent, as the ORM's on_delete already did.
The models are unchanged (no state change)."""

from django.db import migrations

from cadau.dbconstraints import ForeignKeyOnDelete


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0004_agent_memory_uuid"),
    ]

    operations = [
        ForeignKeyOnDelete(
            table="chat_messages", foreign_keys=[("session_id", "chat_sessions", "CASCADE")]
        ),
        ForeignKeyOnDelete(
            table="chat_context_snapshots",
            foreign_keys=[("session_id", "chat_sessions", "CASCADE")],
        ),
        ForeignKeyOnDelete(table="chat_sessions", foreign_keys=[("agent_id", "agents", "SET NULL")]),
    ]
