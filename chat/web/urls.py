from django.urls import path

from chat.web import views

urlpatterns = [
    path("", views.home, name="chat-home"),
    path("chat/<int:session_id>/", views.chat_page, name="chat-page"),
    path("agents/", views.agents_page, name="agents-page"),
    path("agents/<int:agent_id>/", views.agents_page, name="agent-page"),
]
