from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A logout, a password change or a deactivation closes the user's sockets.
        from chat.search import recall
        from chat.services import sockets

        sockets.connect_signals()
        # The history_search tool (registered on import) and automatic recall's prompt part.
        recall.register()
