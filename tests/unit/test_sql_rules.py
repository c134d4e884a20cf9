import re

from lib.store.migrate import RULES_DIR, Rules


def test_the_rules_version_states_the_files_checksum():
    rules = Rules.read()
    assert rules.checksum == rules.digest(), (
        "sql/rules changed: raise the version in sql/rules/VERSION and set its checksum to " + rules.digest()
    )


def test_every_rule_file_is_listed_in_the_order_it_applies():
    assert {p.name for p in Rules.read().files} == {p.name for p in RULES_DIR.glob("*.sql")}


def test_each_function_and_trigger_is_defined_in_one_file_under_sql():
    defined: dict[str, set[str]] = {}
    for path in RULES_DIR.parent.rglob("*.sql"):
        text = path.read_text()
        for kind, name in re.findall(
            r"create\s+(?:or\s+replace\s+)?(function|trigger)\s+([a-z_][a-z0-9_.]*)", text, re.I
        ):
            if path.parent.name == "migrations" and _scaffolding(text, kind, name):
                continue
            defined.setdefault(f"{kind.lower()} {name.lower()}", set()).add(path.name)
    twice = {name: sorted(files) for name, files in defined.items() if len(files) > 1}
    assert not twice, f"defined in more than one file (the one in force is the only one): {twice}"
    elsewhere = {name: files for name, files in defined.items() if not files <= {p.name for p in Rules.read().files}}
    assert not elsewhere, f"functions and triggers are defined in sql/rules alone: {elsewhere}"


def _scaffolding(text: str, kind: str, name: str) -> bool:
    """A function or trigger a migration makes for its own run and drops
    before it ends (002's, which keeps new columns in step while they are
    filled in): no rule, and gone once the migration is applied."""
    return bool(re.search(rf"drop\s+{kind}\s+(?:if\s+exists\s+)?{re.escape(name)}\b", text, re.I))
