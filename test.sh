#!/usr/bin/env bash
# The tests on any machine: a virtualenv with requirements.txt and, as root
# with apt-get, the Debian packages three test files drive (chromium for the
# admin page's browser tests, pgbouncer for the pooler tests, faketime for a
# worker whose host clock is wrong). Where they cannot be installed those tests skip, naming the package (a failure under
# CI=true: tests/conftest.py). Arguments go to pytest; PYTHON picks the
# interpreter that makes the virtualenv, VENV its folder.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

# Installed as far as dpkg knows: apt-get would do nothing for these.
missing=()
for package in chromium pgbouncer faketime; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} with apt-get"
  apt-get update -q && apt-get install -y -q "${missing[@]}" ||
    echo "could not install ${missing[*]}: the tests that drive them are skipped" >&2
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q -r requirements.txt
exec "$VENV/bin/python" -m pytest "$@"
