"""cadau/serve.py: Daphne with its reactor on uvloop. The servers the tests start (scale-out,
browser) and the benchmark run through it, so this only pins the loop it picks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_daphnes_reactor_runs_on_uvloop():
    probe = "import cadau.serve, daphne.server; print(type(daphne.server.twisted_loop).__module__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().startswith("uvloop")


def test_the_launcher_takes_daphnes_options():
    out = subprocess.run(
        [sys.executable, "-m", "cadau.serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--fd" in out.stdout and "--proxy-headers" in out.stdout


def test_the_application_is_loaded_whole_and_frozen_out_of_the_collectors_sight():
    """cadau/asgi.py imports every view and freezes what is loaded: a full garbage collection
    then walks only what requests made since, not the ~140k objects of the loaded code."""
    probe = (
        "import gc, sys; import cadau.asgi; "
        "print(gc.get_freeze_count(), 'chat.api.send' in sys.modules, len(gc.get_objects()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    frozen, views_loaded, tracked = out.stdout.split()
    assert views_loaded == "True"
    assert int(frozen) > 50_000
    assert int(tracked) < int(frozen) // 10


@pytest.mark.django_db(transaction=True)
def test_the_launcher_sweeps_replies_a_killed_process_left_before_serving(owner):
    """`python -m cadau.serve` runs the crash sweep, as `make run` runs sweep_streaming."""
    from datetime import timedelta

    from django.utils import timezone

    import cadau.serve
    from chat.models import ChatMessage, MessageStatus
    from tests.factories import ChatSessionFactory

    session = ChatSessionFactory(owner=owner)
    stuck = ChatMessage.objects.create(
        session=session, role="assistant", content="half", status=MessageStatus.STREAMING
    )
    ChatMessage.objects.filter(pk=stuck.pk).update(
        updated_at=timezone.now() - timedelta(minutes=10)
    )
    assert cadau.serve.startup_sweep() == 1
    stuck.refresh_from_db()
    assert stuck.status == MessageStatus.FAILED and stuck.content == "half"
