"""What the client needs to know about this server: who is logged in and which model answers
(the UI shows a banner when it is the offline provider)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.selectors import model_provider


def _provider(request: Request) -> dict[str, object]:
    info = model_provider()
    if not request.user.is_staff:
        # Where the model server lives is the operator's business, not every user's.
        info.pop("base_url", None)
    return info


class StatusView(APIView):
    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        cfg = settings.CHAT_CONTEXT
        return Response(
            {
                "user": {"id": request.user.pk, "username": request.user.get_username()},
                "provider": _provider(request),
                # What a chat may be switched to (PATCH /chat/sessions/{id} `model`).
                "allowed_models": list(settings.LLM_ALLOWED_MODELS),
                "context": {
                    "strategy": cfg.strategy,
                    "input_budget_runes": cfg.input_budget_runes,
                    "threshold_pct": cfg.threshold_pct,
                    "target_pct": cfg.target_pct,
                },
            }
        )
