from django.apps import AppConfig


class AgentMemoryConfig(AppConfig):
    name = "agentmemory"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"
