"""Account changes that must end what the old credentials opened.

`credentials_revoked` is sent, after the change is saved, when a user's password changes
(however it is made: the admin's form, `changepassword`, set_password + save, a new hash
assigned to `password`), when a user is deactivated, and when a browser session logs out.
Receivers: API tokens (cadau/tokens.py: a password change deletes them) and open WebSockets
(chat/services/sockets.py: closed). Connected at start-up by cadau.apps.

Arguments: `user_id`, `reason` ("password", "deactivated", "logout", or "token": the user's
API key was revoked, cadau/tokens.py) and, for a logout, `session_key` (only that browser
session's sockets end)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_save, pre_save
from django.dispatch import Signal

credentials_revoked = Signal()

_CHANGES = "_cadau_credential_changes"


def _changing(sender: Any, instance: AbstractBaseUser, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    watched = {"password", "is_active"}
    if instance.pk is None or (update_fields is not None and not watched & set(update_fields)):
        return  # a new user has nothing to revoke; a save of other fields (last_login) neither
    # set_password() leaves the raw password in _password until the save completes.
    password = getattr(instance, "_password", None) is not None
    # The user model is swappable: typed loosely, it must still have both fields.
    model: Any = type(instance)
    stored = (
        model._default_manager.filter(pk=instance.pk).values_list("password", "is_active").first()
    )
    changes = []
    if stored is not None:
        if password or stored[0] != instance.password:
            changes.append("password")
        if stored[1] and not getattr(instance, "is_active", True):
            changes.append("deactivated")
    setattr(instance, _CHANGES, changes)


def _revocations_announce(sender: Any, instance: AbstractBaseUser, **kwargs: Any) -> None:
    changes = getattr(instance, _CHANGES, [])
    setattr(instance, _CHANGES, [])
    # Sent inside the saving transaction: what a receiver writes (deleted tokens) commits or
    # rolls back with the change; what it announces (closed sockets) it defers itself.
    for reason in changes:
        credentials_revoked.send(sender=type(instance), user_id=instance.pk, reason=reason)


def _logout_announce(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or user.pk is None:
        return
    session = getattr(request, "session", None)
    credentials_revoked.send(
        sender=type(user),
        user_id=user.pk,
        reason="logout",
        session_key=getattr(session, "session_key", None),
    )


def connect_signals() -> None:
    user_model = get_user_model()
    pre_save.connect(_changing, sender=user_model, dispatch_uid="cadau_credentials_pre")
    post_save.connect(_revocations_announce, sender=user_model, dispatch_uid="cadau_credentials")
    user_logged_out.connect(_logout_announce, dispatch_uid="cadau_credentials_logout")
