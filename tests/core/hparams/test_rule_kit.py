"""The rules kit (hparams/rule_engine.py, the core's table hparams/rules.py, the shared hparams/rule_helpers.py, and
each feature's rules.py): a row whose test is more than one expression is a named function, so a traceback through
it names the row's test rather than `<lambda>`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "tunesmith"
# What makes a lambda more than one expression: a name bound on the way (walrus), a choice (x if c else y), a loop.
SEVERAL_EXPRESSIONS = (ast.NamedExpr, ast.IfExp, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)
MOST_LINES = 2


def lambdas_to_name(source: str) -> list[tuple[int, str]]:
    """(line, why) of each lambda in a rules table that should be a named function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Lambda):
            continue
        kinds = sorted({type(n).__name__ for n in ast.walk(node.body) if isinstance(n, SEVERAL_EXPRESSIONS)})
        lines = node.end_lineno - node.lineno + 1
        if kinds or lines > MOST_LINES:
            found.append((node.lineno, ", ".join(kinds) or f"{lines} lines"))
    return found


def test_every_row_of_more_than_one_expression_is_a_named_function():
    tables = sorted(PACKAGE.rglob("rules.py"))
    assert len(tables) > 10
    problems = [f"{path.relative_to(PACKAGE.parent)}:{line}: a lambda with {why}"
                for path in tables for line, why in lambdas_to_name(path.read_text(encoding="utf-8"))]
    assert not problems, "make these rows named functions (def _what_is_broken(a) above RULES):\n" + "\n".join(problems)


def test_the_check_sees_walrus_choice_loop_and_length():
    source = '''
one = lambda a: a.x and a.y
walrus = lambda a: (v := a.x) and v
choice = lambda a: 1 if a.x else 2
loop = lambda a: [p for p in a.x]
long = lambda a: (a.x
                  and a.y
                  and a.z)
'''
    assert [line for line, _ in lambdas_to_name(source)] == [3, 4, 5, 6]


def test_a_rows_named_test_appears_in_the_traceback_of_its_mistake():
    """A row that reads what it did not declare raises with the row's name noted (rule_engine.check_rows), and the
    traceback names the row's function."""
    import traceback
    from types import SimpleNamespace

    import pytest

    from tunesmith.hparams.rule_engine import Rule, check_rows

    def _reads_an_undeclared_field(a: SimpleNamespace) -> bool:
        return a.model.not_a_field

    row = Rule("undeclared", ("model",), _reads_an_undeclared_field, "never said")
    with pytest.raises(AttributeError) as caught:
        check_rows([row], {"model": SimpleNamespace(model_name_or_path=None)})
    assert "in the rule 'undeclared'" in str(caught.value.__notes__)
    assert "_reads_an_undeclared_field" in "".join(traceback.format_tb(caught.value.__traceback__))
