"""The package's layers: a module imports only from its own layer or the ones below it, so the bottom
(data, models) never depends on the top (recipes, the command). Features sit on the core: a feature package
(its args.py, rules.py, its code and its command.py) imports the core and itself only, and nothing but the
command line's top imports a feature, so one folder holds all of it. Every `tunesmith` import counts,
absolute or relative, at module level or inside a function; only a module's
`if __name__ == "__main__":` block is exempt (a `python -m` spelling that runs the command). The tests mirror the
package: tests/core/<layer>/, tests/features/<feature>/ (one per feature, never missing), tests/cli/, tests/system/,
tests/benchmarks/ and tests/helpers/, imported as the package `tests`, never by editing sys.path."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tunesmith"
TESTS = PACKAGE.parent / "tests"

# The core, bottom to top; a package or module of tunesmith/ by its first name under tunesmith/.
CORE: list[set[str]] = [
    {"constants", "errors", "utils", "boundary"},
    {"distributed"},
    {"families"},  # the model-family registry: read by the rules (hparams/rules.py), data, models, train and export
    {"hparams"},
    {"data"},
    {"models"},
    {"train"},
    {"generation"},
]
# The feature packages, each a folder of args.py (its dataclasses), rules.py (its rows and the facts they read),
# its code and command.py (the pipeline); it imports only the core. Every command is one (issue #53).
FEATURES: set[str] = {"export", "pretrain", "distill", "rl", "serve", "chat", "ui", "sft", "inspect", "plan",
                      "evaluation", "merge", "preference", "vllm_serve"}
TOP = {"cli", "cli_reference", "__main__"}  # cli_reference: the docs' CLI reference, generated from the parser
LAYERS: list[set[str]] = [
    *CORE,
    FEATURES,
    TOP,
]
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}
CORE_NAMES = set().union(*CORE)
ROOT = "__init__"  # tunesmith/__init__.py imports nothing of tunesmith; importing `tunesmith` itself is allowed


def top_name(relative: Path) -> str:
    """`data` for tunesmith/data/dataset.py, `cli` for tunesmith/cli.py, `__init__` for tunesmith/__init__.py."""
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def module_package(relative: Path) -> list[str]:
    """The dotted package a module's relative imports start from, as parts: tunesmith/data/x.py -> tunesmith.data."""
    return ["tunesmith", *relative.parts[:-1]]


def is_main_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and any(isinstance(c, ast.Constant) and c.value == "__main__"
                                                   for c in test.comparators))


def imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except under `if __name__ == "__main__":`."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif not is_main_guard(node):
            todo += ast.iter_child_nodes(node)
    return sorted(found, key=lambda n: n.lineno)


def imported_names(node: ast.Import | ast.ImportFrom, package: list[str], known: Collection[str] = LAYER) -> list[str]:
    """The top names under tunesmith/ an import reaches (`__init__` for the package itself, or a name not known)."""
    if isinstance(node, ast.Import):
        targets = [alias.name.split(".") for alias in node.names]
    else:
        base = package[:len(package) - node.level + 1] if node.level else []
        module = [*base, *(node.module.split(".") if node.module else [])]
        # `from tunesmith import errors` and `from .. import errors` name a module in the alias.
        targets = [[*module, alias.name] for alias in node.names] if module == ["tunesmith"] else [module]
    return [(t[1] if t[1] in known else ROOT) if len(t) > 1 else ROOT for t in targets if t[0] == "tunesmith"]


def layer_violations(relative: Path, source: str) -> list[str]:
    """`file:line: import` for each import of a layer above the module's own."""
    own = top_name(relative)
    problems = []
    for node in imports(ast.parse(source)):
        for name in imported_names(node, module_package(relative)):
            if name != ROOT and LAYER[name] > LAYER[own]:
                problems.append(f"tunesmith/{relative}:{node.lineno}: `{ast.get_source_segment(source, node)}` "
                                f"imports {name} (layer {LAYER[name]}) into {own} (layer {LAYER[own]})")
    return problems


def feature_violations(relative: Path, source: str, features: set[str] = FEATURES) -> list[str]:
    """`file:line: import` for each import of a feature by a module of another feature or of the core (only the
    top, the command line, may import one), and for each import by a feature of anything but the core."""
    own = top_name(relative)
    problems = []
    for node in imports(ast.parse(source)):
        for name in imported_names(node, module_package(relative), set(LAYER) | features):
            if name in (ROOT, own):
                continue
            where = f"tunesmith/{relative}:{node.lineno}: `{ast.get_source_segment(source, node)}`"
            if name in features and own not in TOP:
                into = f"the feature {own}" if own in features else own
                problems.append(f"{where} imports the feature {name} into {into}: only {', '.join(sorted(TOP))} "
                                "import a feature")
            elif own in features and name not in CORE_NAMES:
                problems.append(f"{where} imports {name} into the feature {own}: a feature imports only the core")
    return problems


def modules() -> list[Path]:
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    unplaced = sorted({top_name(m) for m in modules()} - set(LAYER) - {ROOT})
    assert not unplaced, f"add these to LAYERS in tests/core/test_layout.py (and to the layers in STYLE.md): {unplaced}"


def test_no_module_imports_a_layer_above_its_own():
    problems = [p for m in modules() for p in layer_violations(m, (PACKAGE / m).read_text(encoding="utf-8"))]
    assert not problems, "imports must point down the layers:\n" + "\n".join(problems)


def test_features_import_only_the_core_and_only_the_top_imports_a_feature():
    problems = [p for m in modules() for p in feature_violations(m, (PACKAGE / m).read_text(encoding="utf-8"))]
    assert not problems, "a feature imports only the core, and only the command line imports a feature:\n" + \
        "\n".join(problems)


def test_the_feature_check_sees_a_feature_in_the_core_another_feature_and_a_layer_above_the_core():
    in_a_feature = """
from ..models import loader
from .gguf_arch import ARCHITECTURES
from ..merge import command
from ..serve.app import build_app
"""
    problems = feature_violations(Path("export/fake.py"), in_a_feature, features={"export", "merge"})
    assert problems == ["tunesmith/export/fake.py:4: `from ..merge import command` imports the feature merge into "
                        "the feature export: only __main__, cli, cli_reference import a feature",
                        "tunesmith/export/fake.py:5: `from ..serve.app import build_app` imports serve into the feature "
                        "export: a feature imports only the core"]
    in_the_core = "import tunesmith.export.rules\n"
    assert feature_violations(Path("hparams/fake.py"), in_the_core) == [
        "tunesmith/hparams/fake.py:1: `import tunesmith.export.rules` imports the feature export into hparams: only "
        "__main__, cli, cli_reference import a feature"]
    assert not feature_violations(Path("cli.py"), "from .export.command import main\n")


def test_each_feature_is_one_folder_with_its_arguments_rules_and_command():
    """A newcomer opens one folder per feature: its flags (args.ARGUMENTS), its refusals (rules.RULES, which the
    parser checks for its commands after the core's), its command (`tunesmith NAME` runs FEATURE.command); a feature
    of several kinds of run (rl: ppo, eval_policy) has each one's command in its folder."""
    from tunesmith.cli import COMMANDS, HIDDEN_COMMANDS
    from tunesmith.hparams.run_kinds import FEATURE_RUNS

    assert set(FEATURE_RUNS.values()) == {f"tunesmith.{name}" for name in FEATURES}
    for kind, package in FEATURE_RUNS.items():
        folder = PACKAGE / package.removeprefix("tunesmith.")
        assert {"args.py", "rules.py", "command.py"} <= {p.name for p in folder.glob("*.py")}, folder
        assert f"{package}.command" in COMMANDS.values()
        name = kind.replace("_", "-")
        assert (COMMANDS.get(name) or HIDDEN_COMMANDS[name]).startswith(f"{package}."), kind


def test_the_check_sees_relative_absolute_and_function_imports_but_not_the_main_guard():
    source = """
from ..models import loader
from . import template
import tunesmith.train.checkpoints
from tunesmith import sft, errors


def late():
    from ..chat.engine import ChatEngine


if __name__ == "__main__":
    from ..sft.command import main
"""
    problems = layer_violations(Path("data/fake.py"), source)
    assert [p.split(": ", 1)[0] for p in problems] == ["tunesmith/data/fake.py:2", "tunesmith/data/fake.py:4",
                                                       "tunesmith/data/fake.py:5", "tunesmith/data/fake.py:9"]
    assert problems[0] == ("tunesmith/data/fake.py:2: `from ..models import loader` imports models (layer 5) "
                           "into data (layer 4)")
    assert "imports sft (layer 8)" in problems[2] and "ChatEngine" in problems[3]


def private_imports(relative: Path, source: str, package_dirs: Collection[str] | None = None) -> list[str]:
    """`file:line: import` for each `from X import _name` whose X is a module of another package (folder) than the
    importing module's: a name with a leading underscore is its module's own, and another package reads a public one
    (the rules tables' shared helpers are hparams/rule_helpers.py's). `package_dirs`: the dotted packages that are
    folders (read from the disk when None)."""
    own = module_package(relative)
    problems = []
    for node in imports(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = own[:len(own) - node.level + 1] if node.level else []
        module = [*base, *(node.module.split(".") if node.module else [])]
        if module[:1] != ["tunesmith"]:
            continue
        is_dir = (".".join(module) in package_dirs if package_dirs is not None
                  else PACKAGE.parent.joinpath(*module).is_dir())
        if (module if is_dir else module[:-1]) == own:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                problems.append(f"tunesmith/{relative}:{node.lineno}: imports {alias.name}, private to "
                                f"{'.'.join(module)}")
    return problems


def test_no_module_imports_a_private_name_of_another_package():
    problems = [p for m in modules() for p in private_imports(m, (PACKAGE / m).read_text(encoding="utf-8"))]
    assert not problems, "import a public name (make it public where it is shared):\n" + "\n".join(problems)


def test_the_private_import_check_sees_another_packages_private_name_only():
    source = """
from ..hparams.rules import Rule, _problem
from .gguf_llama_cpp import _quiet_stderr
from . import _local
from ..hparams import _shared
import tunesmith.hparams.rules
"""
    problems = private_imports(Path("export/fake.py"), source, package_dirs={"tunesmith.hparams", "tunesmith.export"})
    assert [p.split(": ", 1)[0] for p in problems] == ["tunesmith/export/fake.py:2", "tunesmith/export/fake.py:5"]
    assert problems[0].endswith("imports _problem, private to tunesmith.hparams.rules")


def test_only_the_generation_engine_generates_or_samples_tokens():
    """One home for generation: no module outside tunesmith/generation/ calls a model's generate() or draws
    a token (`engine.generate(...)`, the engine's own method, is the way to generate)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "generation":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "generate", "multinomial") and not ast.unparse(node.func.value).lower().endswith("engine"):
                offenders.append(f"tunesmith/{relative}:{node.lineno}: .{node.func.attr}(")
    assert not offenders, offenders


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def module_imports(relative: Path, modules_by_name: dict[str, Path]) -> set[str]:
    """The tunesmith modules a module imports when it runs (any depth; not under TYPE_CHECKING or the main guard)."""
    own = ".".join(["tunesmith", *relative.with_suffix("").parts]).removesuffix(".__init__")
    package = module_package(relative)
    found, todo = set(), [ast.parse((PACKAGE / relative).read_text(encoding="utf-8"))]
    while todo:
        node = todo.pop()
        if is_main_guard(node) or is_type_checking_block(node):
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules_by_name else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        todo += ast.iter_child_nodes(node)
    return {name for name in found if name in modules_by_name and name != own}


def test_no_two_modules_import_each_other_in_a_circle():
    by_name = {".".join(["tunesmith", *m.with_suffix("").parts]).removesuffix(".__init__"): m for m in modules()}
    graph = {name: module_imports(path, by_name) for name, path in by_name.items()}
    circles = []

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in path:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(sorted(set(circles)))


def test_the_rl_rows_are_the_features_and_the_parser_checks_them_for_its_command():
    """The PPO/GRPO/RLOO rows and bounds sit in tunesmith/rl/rules.py alone, and `parse_run("ppo")` still applies them."""
    from tunesmith.errors import ConfigError
    from tunesmith.hparams import parse_run
    from tunesmith.hparams.rules import RULES as CORE_RULES
    from tunesmith.hparams.run_kinds import feature_rules
    from tunesmith.hparams.value_bounds import BOUNDS
    from tunesmith.rl.rules import RULES

    assert [r.name for r in CORE_RULES if {"ppo", "evaluation"} & set(r.roles)] == []
    assert [b for b in BOUNDS if b.role in ("ppo", "evaluation")] == []
    assert feature_rules("ppo") == feature_rules("eval_policy") == tuple(RULES)
    flags = ["--data_path", "prompts.jsonl", "--reward_funcs", "exact_answer", "--output_dir", "out"]
    for bad, says in ((["--temperature", "0"], "--temperature must be positive"),
                      (["--cliprange", "0"], r"--cliprange must be > 0 \(got 0.0\)")):
        with pytest.raises(ConfigError, match=says):
            parse_run("ppo", [*flags, *bad], check_paths=False)


def test_the_preference_rows_are_the_features_and_the_parser_checks_them_for_its_commands():
    """The DPO/KTO, reward-model and scoring rows and bounds sit in tunesmith/preference/rules.py alone, and
    `parse_run` still applies them to dpo, reward and score."""
    from tunesmith.errors import ConfigError
    from tunesmith.hparams import parse_run
    from tunesmith.hparams.rules import RULES as CORE_RULES
    from tunesmith.hparams.run_kinds import feature_rules
    from tunesmith.hparams.value_bounds import BOUNDS
    from tunesmith.preference.rules import RULES

    assert [r.name for r in CORE_RULES if {"dpo", "reward", "score"} & set(r.roles)] == []
    assert [b for b in BOUNDS if b.role in ("dpo", "reward", "score")] == []
    assert feature_rules("dpo") == feature_rules("reward") == feature_rules("score") == tuple(RULES)
    for kind, flags, says in (("dpo", ["--beta", "0"], r"--beta must be > 0 \(got 0.0\)"),
                              ("reward", ["--center_rewards_coefficient", "-1"], "--center_rewards_coefficient must"),
                              ("score", [], "--output_file is required")):
        with pytest.raises(ConfigError, match=says):
            parse_run(kind, ["--data_path", "pairs.jsonl", *flags], check_paths=False)


# -- the tests mirror the package

# Folders of tests that are no layer or feature: the command line's front, the runs of several processes and the real
# model, the benchmark scripts' own tests; helpers/ holds no test.
TEST_HOMES = {"cli", "system", "benchmarks"}
# The benchmark scripts import each other through sys.path until the benchmarks package lands (issue #63, item 3):
# these two tests import them the same way. Nothing else may.
def modules_of_tests() -> list[Path]:
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))


def has_a_test(path: Path) -> bool:
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def misplaced_test_files(files: list[Path]) -> list[str]:
    """Each test module not where the package's shape puts it: tests/core/<a core layer>/, tests/features/<a
    feature>/, one of TEST_HOMES, or this file itself at tests/core/."""
    homes = {("core", name) for name in CORE_NAMES} | {("features", name) for name in FEATURES}
    return [f"tests/{f}" for f in files
            if not (tuple(f.parts[:2]) in homes and len(f.parts) == 3
                    or len(f.parts) == 2 and f.parts[0] in TEST_HOMES
                    or f == Path("core", Path(__file__).name))]


def sys_path_edits(source: str) -> list[int]:
    """The lines that touch sys.path (`sys.path.insert(...)`, `sys.path[:0] = ...`, `from sys import path`)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                   and node.value.id == "sys"
                   or isinstance(node, ast.ImportFrom) and node.module == "sys"
                   and any(alias.name == "path" for alias in node.names)})


def test_every_feature_has_its_folder_of_tests():
    """`pytest tests/features/NAME` is the feature's whole suite: every feature package has its folder there, with
    at least one test, and no folder there is of a feature that does not exist."""
    folders = {p.name for p in (TESTS / "features").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not folders - FEATURES, f"tests/features/ holds folders of no feature: {sorted(folders - FEATURES)}"
    missing = [f"tests/features/{name}/" for name in sorted(FEATURES)
               if not any(has_a_test(p) for p in (TESTS / "features" / name).glob("test_*.py"))]
    assert not missing, f"these features have no tests (a test_*.py with a test in its folder): {missing}"


def test_every_test_module_lives_where_the_package_does():
    assert not misplaced_test_files(modules_of_tests()), (
        "a test module goes to tests/core/<layer>/, tests/features/<feature>/ or tests/{cli,system,benchmarks}/ "
        f"(docs/tests.md): {misplaced_test_files(modules_of_tests())}")


def test_no_test_edits_sys_path():
    """Tests import what they share as the package `tests` (tests.helpers..., tests.features.rl.test_grpo), so a
    module means the same whichever test ran first."""
    edits = [f"tests/{p.relative_to(TESTS)}:{line}" for p in sorted(TESTS.rglob("*.py"))
             for line in sys_path_edits(p.read_text(encoding="utf-8"))]
    assert not edits, f"import through the package `tests` instead of editing sys.path: {edits}"


def test_the_test_tree_checks_see_a_misplaced_module_and_each_spelling_of_a_sys_path_edit():
    files = [Path("core/data/test_formats.py"), Path("core/test_layout.py"), Path("features/rl/test_grpo.py"),
             Path("cli/test_config.py"), Path("test_stray.py"), Path("features/nofeature/test_x.py"),
             Path("core/tokenizers/test_y.py"), Path("helpers/test_z.py"), Path("features/rl/deep/test_w.py")]
    assert misplaced_test_files(files) == ["tests/test_stray.py", "tests/features/nofeature/test_x.py",
                                           "tests/core/tokenizers/test_y.py", "tests/helpers/test_z.py",
                                           "tests/features/rl/deep/test_w.py"]
    source = "import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nfrom sys import path\nimport os.path\n"
    assert sys_path_edits(source) == [2, 3, 4]
