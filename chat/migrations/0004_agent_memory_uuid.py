"""Agent.memory_uuid: every agent's memory folder is named by a random UUID from now on.

Existing agents get one each, and their folder {RUNTIME_DIR}/{id}/ (if any) is renamed to
{RUNTIME_DIR}/{uuid}/ with the owner marker agentmemory/folders.py checks, so their memory
carries over. A folder named by an id that has no agent in this database is left where it is:
it is exactly the case this change is about (a previous database's agent), and nothing will
read it. Reversing renames the folders back and removes the marker.

Self-contained on purpose (a migration must not follow later changes of the app's code); the
marker's format is agentmemory.folders.MARKER_NAME / marker_text.
"""

import json
import os
import uuid

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import migrations, models

MARKER_NAME = ".cadau-agent.json"


def _marker(agent_uuid, agent_id, owner_id):
    body = {"agent_uuid": str(agent_uuid), "agent_id": agent_id, "owner_id": owner_id}
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def _storage():
    from django.core.files.storage import FileSystemStorage, storages
    from django.utils.module_loading import import_string

    spec = getattr(settings, "AGENT_MEMORY_STORAGE", "") or ""
    if not spec:
        return FileSystemStorage(location=settings.RUNTIME_DIR)
    if spec in storages.backends:
        return storages[spec]
    return import_string(spec)()


def _walk(storage, prefix):
    try:
        dirs, files = storage.listdir(prefix)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in files:
        yield f"{prefix}/{name}"
    for name in dirs:
        yield from _walk(storage, f"{prefix}/{name}")


def _move(storage, old, new, marker):
    """Renames folder `old` to `new` (storage names) and writes `marker` into it."""
    location = getattr(storage, "location", None)
    if location is not None and hasattr(storage, "path"):
        source, target = os.path.join(location, old), os.path.join(location, new)
        if os.path.islink(source) or not os.path.isdir(source) or os.path.lexists(target):
            return
        os.rename(source, target)
        if marker is not None:
            path = os.path.join(target, MARKER_NAME)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(marker)
        else:
            try:
                os.unlink(os.path.join(target, MARKER_NAME))
            except FileNotFoundError:
                pass
        return
    names = list(_walk(storage, old))
    if not names:
        return
    for name in names:
        if name.endswith("/" + MARKER_NAME):
            continue
        with storage.open(name, "rb") as handle:
            storage.save(new + name[len(old) :], ContentFile(handle.read()))
    if marker is not None:
        storage.save(f"{new}/{MARKER_NAME}", ContentFile(marker))
    for name in names:
        storage.delete(name)


def forwards(apps, schema_editor):
    Agent = apps.get_model("chat", "Agent")
    storage = _storage()
    for agent in Agent.objects.all().only("id", "owner_id").iterator():
        agent.memory_uuid = uuid.uuid4()
        agent.save(update_fields=["memory_uuid"])
        _move(
            storage,
            str(agent.id),
            str(agent.memory_uuid),
            _marker(agent.memory_uuid, agent.id, agent.owner_id),
        )


def backwards(apps, schema_editor):
    Agent = apps.get_model("chat", "Agent")
    storage = _storage()
    for agent in Agent.objects.exclude(memory_uuid=None).only("id", "memory_uuid").iterator():
        _move(storage, str(agent.memory_uuid), str(agent.id), None)


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0003_streaming_index_by_session"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="memory_uuid",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(forwards, backwards),
        migrations.AlterField(
            model_name="agent",
            name="memory_uuid",
            field=models.UUIDField(default=uuid.uuid4, unique=True, editable=False),
        ),
    ]
