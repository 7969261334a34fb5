from django.apps import AppConfig


class AgentMemoryConfig(AppConfig):
    name = "agentmemory"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # chat never imports agentmemory: it exposes hooks and a tool registry, filled here.
        from agentmemory import hooks, tools

        hooks.register()
        tools.register()
