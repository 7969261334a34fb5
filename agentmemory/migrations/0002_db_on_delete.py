"""ON DELETE in the database for the flush ledger (cadau/dbconstraints.py): a raw delete of its
session deletes its rows, a raw delete of its agent leaves them without one, as the models'
on_delete already did in the ORM. The model is unchanged (no state change)."""

from django.db import migrations

from cadau.dbconstraints import ForeignKeyOnDelete


class Migration(migrations.Migration):
    dependencies = [
        ("agentmemory", "0001_initial"),
        ("chat", "0005_db_on_delete"),
    ]

    operations = [
        ForeignKeyOnDelete(
            table="agent_memory_flushes",
            foreign_keys=[
                ("session_id", "chat_sessions", "CASCADE"),
                ("agent_id", "agents", "SET NULL"),
            ],
        ),
    ]
