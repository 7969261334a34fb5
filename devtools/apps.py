from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    # An app only so that Django finds the `fakellm` management command; it has no models.
    name = "devtools"
    verbose_name = "Development tools"
