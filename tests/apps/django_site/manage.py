#!/usr/bin/env python
"""The test site's manage.py: Django's commands, with the repository on the
path for lib.adapters. DJANGO_DB_DRIVER=psycopg2 makes Django use psycopg2
even where psycopg 3 is installed (djsite/settings.py)."""

import os
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
sys.path[:0] = [str(SITE), str(SITE.parents[2])]

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
