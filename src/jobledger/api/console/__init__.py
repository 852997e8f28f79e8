"""The web console: server-rendered pages (Jinja2) for the people in the loop.

The approvals inbox, the jobs list, a job's page with its timeline and chain badge, and
the tenant's spend per UTC day; sign-in turns a credential the API's Authenticator
accepts into a signed session cookie. ``create_app`` mounts it with
``app.include_router(console.router(...))``.
"""

from __future__ import annotations

from jobledger.api.console.routes import PREFIX, router

__all__ = ["PREFIX", "router"]
