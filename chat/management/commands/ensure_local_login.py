"""`make run` calls this so a newcomer can log in from what the terminal shows.

First run: creates the superuser `admin` with a random password and keeps it in the git-ignored,
owner-only file `.local-login`. Later runs print it again, unless the password was changed since
(then the file is stale and we say so rather than print a wrong password).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME = "admin"


class Command(BaseCommand):
    help = "Make sure a local login exists and print how to use it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/")

    def handle(self, *args: Any, **options: Any) -> None:
        login_file = Path(settings.BASE_DIR) / ".local-login"
        user_model = get_user_model()
        user = user_model.objects.filter(username=USERNAME).first()
        password = login_file.read_text().strip() if login_file.is_file() else ""
        if user is None:
            password = secrets.token_urlsafe(12)
            user_model.objects.create_superuser(USERNAME, email="", password=password)
            tmp = login_file.with_suffix(".tmp")
            tmp.write_text(password + "\n")
            tmp.chmod(0o600)
            tmp.replace(login_file)
        url = options["url"]
        self.stdout.write("")
        self.stdout.write(f"  Cadau is starting on {url}")
        if password and user_model.objects.get(username=USERNAME).check_password(password):
            self.stdout.write(f"  Log in as   user: {USERNAME}   password: {password}")
        else:
            self.stdout.write(
                f"  Log in as '{USERNAME}' with the password you set "
                f"(reset it: .venv/bin/python manage.py changepassword {USERNAME})"
            )
        self.stdout.write(f"  API docs: {url}api/docs/   admin: {url}admin/")
        self.stdout.write("")
