"""Settings of the test site: one database, DATABASE_URL's, which holds the
jobs table too; tasks go through lib.adapters.django_tasks.JobsBackend."""

import os
import sys
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

if os.environ.get("DJANGO_DB_DRIVER") == "psycopg2":
    # Django's backend uses psycopg 3 whenever it imports: a None entry makes
    # that import fail, so it falls back to psycopg2.
    if sys.modules.get("psycopg") is not None:
        raise RuntimeError("psycopg 3 was imported before the settings could keep Django from it")
    sys.modules["psycopg"] = None  # type: ignore[assignment]


def database(url: str) -> dict[str, Any]:
    """A Django DATABASES entry of a postgresql:// URL; a host and port in
    its query (a Unix socket's folder) count as the URL's own."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": options.pop("host", None) or parts.hostname or "",
        "PORT": options.pop("port", None) or parts.port or "",
        "OPTIONS": options,
    }


try:
    import django.tasks  # noqa: F401

    BACKPORT: list[str] = []
except ImportError:  # Django 5.2: the backport is an app
    BACKPORT = ["django_tasks"]

SECRET_KEY = "test-site-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [*BACKPORT, "shop"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "djsite.urls"
DATABASES = {"default": database(os.environ["DATABASE_URL"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
TASKS = {
    "default": {
        "BACKEND": "lib.adapters.django_tasks.JobsBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"database": "default"},
    }
}
