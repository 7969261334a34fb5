"""/api/v1/agents: thin views over chat.services.agents. Every id goes through `agent_for_user`,
so another user's agent is the same JSON 404 as a missing one."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.api.errors import ApiError
from chat.api.serializers import ErrorSerializer
from chat.api.throttles import API_THROTTLES, per_user
from chat.models import Agent
from chat.selectors import agent_for_user, agent_list
from chat.services.agents import agent_create, agent_delete, agent_update

AGENT_ID_PATH = OpenApiParameter(
    "agent_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="Agent id."
)
ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="Invalid input."),
    403: OpenApiResponse(ErrorSerializer, description="Not authenticated."),
    404: OpenApiResponse(ErrorSerializer, description="Not found (or not yours)."),
}


class AgentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Agent
        fields = ["id", "name", "system_prompt", "model", "config_json", "created_at", "updated_at"]
        read_only_fields = fields


class AgentListSerializer(serializers.Serializer):
    results = AgentSerializer(many=True)


class AgentWriteSerializer(serializers.Serializer):
    """Shapes only; the rules (lengths, config_json keys and types) live in the service."""

    name = serializers.JSONField(required=False)
    system_prompt = serializers.JSONField(required=False)
    model = serializers.JSONField(required=False)
    config_json = serializers.JSONField(required=False)


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ApiError("the request body must be a JSON object", code="invalid")
    unknown = sorted(set(request.data) - set(AgentWriteSerializer().fields))
    if unknown:
        raise ApiError(f"unknown field(s): {', '.join(unknown)}", code="invalid")
    return dict(request.data)


class AgentListCreateView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("agent_create")]

    @extend_schema(
        operation_id="agents_list",
        responses={200: AgentListSerializer, 403: ERRORS[403]},
        description="The caller's agents, newest first.",
    )
    def get(self, request: Request) -> Response:
        agents = agent_list(user=request.user)
        return Response({"results": AgentSerializer(agents, many=True).data})

    @extend_schema(
        operation_id="agents_create",
        request=AgentWriteSerializer,
        responses={201: AgentSerializer, 400: ERRORS[400], 403: ERRORS[403]},
    )
    def post(self, request: Request) -> Response:
        data = _body(request)
        if "name" not in data:
            raise ApiError("name is required", code="invalid")
        agent = agent_create(
            user=request.user,
            name=data["name"],
            system_prompt=data.get("system_prompt", ""),
            model=data.get("model", ""),
            config_json=data.get("config_json", {}),
        )
        return Response(AgentSerializer(agent).data, status=status.HTTP_201_CREATED)


class AgentDetailView(APIView):
    @extend_schema(
        operation_id="agents_retrieve",
        parameters=[AGENT_ID_PATH],
        responses={200: AgentSerializer, 403: ERRORS[403], 404: ERRORS[404]},
    )
    def get(self, request: Request, agent_id: str) -> Response:
        return Response(AgentSerializer(agent_for_user(user=request.user, agent_id=agent_id)).data)

    @extend_schema(
        operation_id="agents_update",
        parameters=[AGENT_ID_PATH],
        request=AgentWriteSerializer,
        responses={200: AgentSerializer, **ERRORS},
        description="Change the given fields; config_json is replaced as a whole.",
    )
    def patch(self, request: Request, agent_id: str) -> Response:
        agent = agent_for_user(user=request.user, agent_id=agent_id)
        agent = agent_update(agent=agent, **_body(request))
        return Response(AgentSerializer(agent).data)

    @extend_schema(
        operation_id="agents_destroy",
        parameters=[AGENT_ID_PATH],
        responses={204: None, 403: ERRORS[403], 404: ERRORS[404]},
        description="Its sessions stay as plain chats; its memory files are kept.",
    )
    def delete(self, request: Request, agent_id: str) -> Response:
        agent_delete(agent=agent_for_user(user=request.user, agent_id=agent_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
