"""The server-rendered chat page (templates/chat/, static/chat/)."""
