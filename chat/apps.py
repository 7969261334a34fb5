from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks
        from django.db.backends.signals import connection_created

        from chat import checks as chat_checks
        from chat.search import backends, recall
        from chat.services import sockets

        # SQL functions of the message search (Unicode case folding on SQLite).
        connection_created.connect(backends.sqlite_functions_register, weak=False)
        # A logout, a password change or a deactivation closes the user's sockets.
        sockets.connect_signals()
        # The history_search tool, registered on import.
        recall.register()
        checks.register(chat_checks.agent_tools_check)
