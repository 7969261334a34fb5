"""The project's own app: cross-cutting security wiring (token rotation, login lockout) that
must be connected at start-up, whichever entry point runs (server, admin, management command)."""

from django.apps import AppConfig


class CadauConfig(AppConfig):
    name = "cadau"
    verbose_name = "Cadau"

    def ready(self) -> None:
        from cadau import accounts, logins, tokens

        accounts.connect_signals()
        tokens.connect_signals()
        logins.connect_signals()
