from django.apps import AppConfig


class AgentMemoryConfig(AppConfig):
    name = "agentmemory"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # chat never imports agentmemory: it exposes hooks and a tool registry, filled here.
        from django.core import checks

        from agentmemory import hooks, tools
        from agentmemory.checks import memory_storage_check

        hooks.register()
        tools.register()
        checks.register(memory_storage_check)
