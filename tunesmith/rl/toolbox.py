"""Tools for agent rollouts: Python functions named on the command line (`--tool_funcs
package.module:function`), described to the model as the OpenAI tools schema that chat templates render
(transformers' `get_json_schema`, from the type hints and the Google-style docstring, as
`apply_chat_template(tools=[fn])` describes a function), and run on the calls the model makes.

A function that cannot be loaded or described is a ConfigError naming it, before any model loads. A call
never raises: wrong arguments, an exception inside the function, or a function still running after
`timeout` seconds become the tool message's text ("error: ZeroDivisionError: division by zero"), which is
what the model reads next, as an agent framework would hand it back. A call runs on a daemon thread of its
own, so a function that never returns costs its thread, not the training run."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..data.formats import offered_tools
from ..data.prompts import Prompt
from ..data.tool_calls import ToolCall, tool_names
from ..errors import ConfigError
from ..utils.imports import import_function

DEFAULT_TIMEOUT = 10.0  # seconds a call may run (--tool_timeout)

# JSON schema types (as get_json_schema writes them) and the Python values a call's JSON arguments give for them.
JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                           "boolean": (bool,), "array": (list,), "object": (dict,),
                                           "null": (type(None),)}


@dataclass(frozen=True)
class ToolResult:
    """What a call gave: the tool message's text, and whether the call failed (bad arguments, an
    exception, a timeout), which rollouts count."""

    text: str
    failed: bool = False


class Tool:
    """One function the model may call: its spec as given, the function, and its schema (the tools entry)."""

    def __init__(self, spec: str, fn: Callable[..., Any], schema: dict) -> None:
        self.spec, self.fn, self.schema = spec, fn, schema

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    def check_arguments(self, arguments: dict) -> str | None:
        """Why these arguments cannot be passed (a missing or unknown name, a value of the wrong JSON type),
        or None. The model gets the reason back as the call's result."""
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):  # a builtin without a signature: let the call tell
            return None
        named = {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        unknown = [n for n in arguments if n not in named]
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            unknown = []
        missing = [n for n, p in named.items() if p.default is p.empty and n not in arguments]
        if missing or unknown:
            return "; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                             + ([f"no parameter {', '.join(unknown)}"] if unknown else []))
        properties = self.schema["function"].get("parameters", {}).get("properties", {})
        for name, value in arguments.items():
            problem = _type_problem(value, properties.get(name, {}))
            if problem:
                return f"`{name}` {problem}"
        return None

    def __call__(self, arguments: str | dict, timeout: float = DEFAULT_TIMEOUT) -> ToolResult:
        """Run one call (arguments as JSON text or an object) with a time limit; never raises."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return ToolResult(f"error: the arguments are not JSON ({e.msg})", True)
        if not isinstance(arguments, dict):
            return ToolResult(f"error: the arguments must be a JSON object, not {type(arguments).__name__}", True)
        problem = self.check_arguments(arguments)
        if problem:
            return ToolResult(f"error: bad arguments for {self.name}: {problem}", True)
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = self.fn(**arguments)
            except BaseException as e:  # noqa: BLE001 -- the model reads what went wrong, training goes on
                outcome["error"] = e

        thread = threading.Thread(target=target, name=f"tool-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            return ToolResult(f"error: {self.name} did not finish within {timeout:g} seconds", True)
        if "error" in outcome:
            error = outcome["error"]
            return ToolResult(f"error: {type(error).__name__}: {error}", True)
        return ToolResult(result_text(outcome.get("value")))


def _type_problem(value: Any, schema: dict) -> str | None:
    """Why `value` does not fit a parameter's schema (its JSON type, its enum), or None."""
    if value is None and schema.get("nullable"):
        return None
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    known = [k for k in kinds if k in JSON_TYPES]
    if known and not any(isinstance(value, JSON_TYPES[k]) and not (isinstance(value, bool) and k in ("integer", "number"))
                         for k in known):
        return f"must be {' or '.join(known)}, got {json.dumps(value, ensure_ascii=False)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(json.dumps(v, ensure_ascii=False) for v in schema['enum'])}"
    return None


def result_text(value: Any) -> str:
    """A function's return value as the tool message's text: a string as it is, anything JSON can write
    as JSON (what tool results usually are), anything else as str()."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def load_tool(spec: str) -> Tool:
    """`package.module:function`, checked and described (ConfigError naming the spec where it cannot be)."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    where = f"--tool_funcs {spec}"
    fn = import_function(spec, "tool_funcs")
    try:
        schema = get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as e:
        raise ConfigError(f"{where}: cannot describe it to the model: {e} (give it a docstring whose first lines say "
                          "what it does, an Args: section describing every parameter, and a type hint on every "
                          "parameter, as transformers' get_json_schema reads them)") from None
    return Tool(spec, fn, schema)


class Toolbox:
    """The functions of a run, by name, with the time limit of a call. `schemas` is the tools list a prompt
    offers; `run` runs a round's calls concurrently, each within the limit."""

    def __init__(self, tools: Sequence[Tool], timeout: float = DEFAULT_TIMEOUT) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ConfigError(f"--tool_funcs {self.tools[tool.name].spec} and {tool.spec}: two functions named "
                                  f"{tool.name!r}; the model calls them by name, so give each its own")
            self.tools[tool.name] = tool
        self.timeout = timeout

    @classmethod
    def from_specs(cls, specs: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> Toolbox:
        return cls([load_tool(spec) for spec in specs], timeout)

    @property
    def schemas(self) -> list[dict]:
        return [tool.schema for tool in self.tools.values()]

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def offered(self, prompt: Prompt) -> list[dict]:
        """The tools a prompt offers the model: its row's own `tools` where it has them (their specs render as
        the data gives them, as in SFT; each must name a loaded function), else every loaded function."""
        own = offered_tools(prompt.row)
        if not own:
            return self.schemas
        missing = [name for name in tool_names(own) if name not in self.tools]
        if missing:
            raise prompt.row.error(f"offers {', '.join(missing)}, which no --tool_funcs function provides (loaded: "
                                   f"{', '.join(self.names)})", "tools")
        return own

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Every call's result, in order; the calls run at once, so a round waits at most one time limit
        (plus the calls' own start-up), however many rows made calls."""
        results: list[ToolResult | None] = [None] * len(calls)

        def one(k: int, call: ToolCall) -> None:
            tool = self.tools.get(call.name)
            results[k] = (tool(call.arguments, self.timeout) if tool is not None else
                          ToolResult(f"error: no function named {call.name!r}", True))

        threads = [threading.Thread(target=one, args=(k, call), daemon=True) for k, call in enumerate(calls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()  # each returns within its own time limit (Tool.__call__ stops waiting then)
        return [r if r is not None else ToolResult("error: the call did not run", True) for r in results]
