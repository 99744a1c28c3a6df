"""The documentation runs as written and matches the code.

Pages: ``README.md``, ``recipe/diva_grpo/README.md`` and ``docs/**/*.md``. Checked:

* every fenced ``bash`` block parses (``bash -n``); in it, every command of the project's is checked against the
  code: ``bash run_scripts/X.sh`` names a file, its leading ``VAR=...`` (and the block's ``export``s) are variables
  that script reads (itself, the scripts it runs, or the project's Python), its ``key=value`` arguments are Hydra
  keys of the recipe's config; ``diva-prep`` / ``diva-report`` / ``python -m data_prep`` / ``python -m
  verl_ext.report`` parse with the CLI's own argparse parser; ``python -m <project module>`` and ``python <file>``
  name a module or file whose argparse options include the ones used; ``python -m recipe.diva_grpo.main_diva``'s
  overrides are Hydra keys; ``python -`` heredocs compile; other ``python -m X`` import; ``pip install -e .[x]``
  names an extra of ``setup.py``;
* the option tables (``| key | default | meaning |``) of each method page hold exactly the fields of the method's
  config dataclass (nested ones dotted) with their defaults, which the yaml's block also holds; the tables of
  ``| option (`diva-prep <sub>`) |``, ``| variable (`run_scripts/X.sh`) |`` and ``| reward_kwargs key |`` name
  options, variables and keyword arguments that exist, with their defaults;
* relative links resolve, to a file and (``#anchor``) to one of its headings;
* the README keeps CI's two commands and stays short.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# The seed sweeps' notebooks (benchmarks/results/<folder>/NOTES.md) are pages too: their links and commands are checked.
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "recipe/diva_grpo/README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks/results").glob("*/NOTES.md"),
    ]
)
PROJECT_PACKAGES = ("verl_ext", "data_prep", "recipe")
# Set by the machine or a shell, not read by the project's code.
GENERIC_ENV = {"PATH", "HOME", "PYTHONPATH", "CUDA_VISIBLE_DEVICES"}
README_COMMAND_1 = (
    'pip install torch==2.14.1 torchvision==0.29.1 && pip install -e ".[test]" && python -m pytest tests -q -m '
    '"not gpu_stack and not launch"'
)
README_GPU_STACK = (
    'DIVA_REQUIRE_VLLM=1 ~/venvs/diva-vllm-cpu/bin/python -m pytest tests -q -m "gpu_stack and not extended"'
)
README_MAX_LINES = 250


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------------------------------------- markdown


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """``(info string, first line number, body)`` of every fenced code block."""
    blocks, info, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if info is None:
                info, start, body = line[3:].strip(), number + 1, []
            else:
                blocks.append((info, start, "\n".join(body) + "\n"))
                info = None
        elif info is not None:
            body.append(line)
    return blocks


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """``(header cells, rows of cells)`` of every pipe table (cells stripped; ``\\|`` is not a separator)."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1]):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            found.append((header, rows))
        else:
            i += 1
    return found


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _code(cell: str) -> str | None:
    """The text of a cell that is one code span, else ``None``."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    # headings outside code blocks only
    inside, found = False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


# ------------------------------------------------------------------------------------------ shell commands


def commands(body: str) -> list[tuple[dict, list[str], str | None]]:
    """The simple commands of a bash block: ``(env of its VAR=... prefix and the block's exports, words, heredoc
    body or None)``; assignments alone, loop keywords and heredoc bodies are not commands."""
    lines = body.replace("\\\n", "").splitlines()
    out, exported, i = [], {}, 0
    while i < len(lines):
        lexer = shlex.shlex(lines[i], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        i += 1
        heredoc = None
        if "<<" in tokens:
            at = tokens.index("<<")
            delimiter = tokens[at + 1]
            text = []
            while i < len(lines) and lines[i].strip() != delimiter:
                text.append(lines[i])
                i += 1
            i += 1
            heredoc = "\n".join(text) + "\n"
            tokens = tokens[:at]
        words: list[str] = []
        for token in [*tokens, ";"]:
            if token in (";", "&&", "||", "|", "&"):
                if words:
                    _add(out, exported, words, heredoc)
                words = []
            else:
                words.append(token)
    return out


def _add(out, exported, words, heredoc):
    while words and words[0] in ("do", "then", "else", "done", "fi", "time"):
        words = words[1:]
    if not words or words[0] in ("for", "while", "if", "case"):
        return
    env = dict(exported)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:  # VAR=value alone: a shell variable of the block
        return
    if words[0] == "export":
        for word in words[1:]:
            name, _, value = word.partition("=")
            exported[name] = value
        return
    out.append((env, words, heredoc))


@cache
def hydra_config() -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "recipe/diva_grpo/config"), version_base=None):
        return OmegaConf.to_container(compose("diva_grpo"), resolve=False)


def _lookup(tree, dotted: str):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def check_overrides(words: list[str]) -> list[str]:
    """Problems with the Hydra overrides among ``words`` (``key=value``, ``+key=value``, ``~key``)."""
    problems = []
    for word in words:
        if word.startswith("-") or "=" not in word and not word.startswith("~"):
            continue
        key = word.split("=", 1)[0]
        if not re.fullmatch(r"[+~]*[A-Za-z_][\w.]*", key):
            continue
        try:
            if key.startswith("+"):
                parent = key.lstrip("+").rpartition(".")[0]
                if parent:
                    _lookup(hydra_config(), parent)
            else:
                _lookup(hydra_config(), key.lstrip("~"))
        except KeyError:
            problems.append(f"Hydra key {key!r} is not in recipe/diva_grpo/config/diva_grpo.yaml (or verl's defaults)")
    return problems


def _script_refs(text: str) -> list[str]:
    return re.findall(r"run_scripts/([\w.]+\.sh)|\)/([\w.]+\.sh)", text)


@cache
def script_closure(script: str) -> tuple[Path, ...]:
    """``script`` and every run_scripts/*.sh it runs, transitively, in the order met."""
    order, todo = [], [ROOT / script]
    while todo:
        path = todo.pop(0)
        if path in order or not path.exists():
            continue
        order.append(path)
        for a, b in _script_refs(path.read_text()):
            todo.append(ROOT / "run_scripts" / (a or b))
    return tuple(order)


@cache
def python_env_names() -> frozenset[str]:
    """Upper-case string constants of the project's Python: the environment variables it may read."""
    names = set()
    for package in PROJECT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(re.findall(r"[\"']([A-Z][A-Z0-9_]{2,})[\"']", path.read_text()))
    return frozenset(names)


def script_env_names(script: str) -> set[str]:
    names = set()
    for path in script_closure(script):
        names.update(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", path.read_text()))
    return names


def script_default(script: str, name: str) -> str | None:
    """The literal default of ``${name:-...}`` / ``${name-...}`` met first in the script's closure (None: none, or
    computed)."""
    for path in script_closure(script):
        match = re.search(r"\$\{" + name + r":?-([^}]*)\}", path.read_text())
        if match:
            value = match.group(1).strip("\"'")
            return None if "$" in value else value
    return None


@cache
def argparse_options(path: Path) -> frozenset[str]:
    """Option strings of the ``add_argument`` calls of a file (read, not run)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    found.add(arg.value)
    return frozenset(found)


def _parse_with(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    try:
        parser.parse_args(args)
    except SystemExit as err:
        return f"{parser.prog} rejects {args}: exit {err.code}"
    return None


def _diva_prep_parser() -> argparse.ArgumentParser:
    from data_prep.cli import build_parser

    return build_parser()


def _diva_report_parser() -> argparse.ArgumentParser:
    from verl_ext.report.cli import build_parser

    return build_parser()


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.exists():
            return candidate
    return None


def _options_used(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def check_command(env: dict, words: list[str], heredoc: str | None) -> list[str]:
    """Problems with one command of a bash block (empty: fine, or not a command of the project's)."""
    word, args = words[0], words[1:]
    if word == "bash" and args and not args[0].startswith("-"):
        script, rest = args[0], args[1:]
        if not (ROOT / script).is_file():
            return [f"no file {script}"]
        problems = []
        if script.startswith("run_scripts/"):
            known = script_env_names(script) | python_env_names() | GENERIC_ENV
            problems += [f"{script} reads no variable {name}" for name in env if name not in known]
            problems += check_overrides(rest)
        return problems
    if word == "diva-prep":
        return [p for p in [_parse_with(_diva_prep_parser(), args)] if p]
    if word == "diva-report":
        return [p for p in [_parse_with(_diva_report_parser(), args)] if p]
    if re.fullmatch(r"(.*/)?python3?", word):
        if args[:1] == ["-"]:
            try:
                compile(heredoc or "", "<heredoc>", "exec")
            except SyntaxError as err:
                return [f"the python heredoc does not compile: {err}"]
            return []
        if args[:1] == ["-m"] and len(args) > 1:
            module, rest = args[1], args[2:]
            if module == "data_prep":
                return [p for p in [_parse_with(_diva_prep_parser(), rest)] if p]
            if module == "verl_ext.report":
                return [p for p in [_parse_with(_diva_report_parser(), rest)] if p]
            if module == "recipe.diva_grpo.main_diva":
                return check_overrides(rest)
            if module.split(".")[0] in PROJECT_PACKAGES:
                path = _module_file(module)
                if path is None:
                    return [f"no module {module}"]
                return [f"{module} has no option {o}" for o in _options_used(rest) if o not in argparse_options(path)]
            return [] if importlib.util.find_spec(module) else [f"no module {module} here"]
        if args and args[0].endswith(".py"):
            path = ROOT / args[0]
            if not path.is_file():
                return [f"no file {args[0]}"]
            return [f"{args[0]} has no option {o}" for o in _options_used(args[1:]) if o not in argparse_options(path)]
        return []
    if word == "pip" and args[:1] == ["install"]:
        extras = set(_setup_extras())
        return [
            f"setup.py has no extra {extra!r}"
            for a in args
            for extra in re.findall(r"^\.\[([\w,-]+)\]$", a)
            for extra in extra.split(",")
            if extra not in extras
        ]
    return []


@cache
def _setup_extras() -> tuple[str, ...]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict):
            return tuple(k.value for k in node.value.keys)
    return ()


def _bash_blocks():
    for page in PAGES:
        for info, line, body in fenced_blocks(page.read_text()):
            if info == "bash":
                yield pytest.param(page, line, body, id=f"{_rel(page)}:{line}")


@pytest.mark.parametrize("page, line, body", list(_bash_blocks()))
def test_bash_block_runs_as_written(page, line, body):
    parsed = subprocess.run(["bash", "-n"], input=body, capture_output=True, text=True)
    assert parsed.returncode == 0, f"{_rel(page)}:{line}: bash -n: {parsed.stderr}"
    problems = [p for env, words, heredoc in commands(body) for p in check_command(env, words, heredoc)]
    assert problems == [], f"{_rel(page)}:{line}: " + "; ".join(problems)


# ------------------------------------------------------------------------------------------- option tables


def parse_default(text: str):
    """A documented default (a code span) as a Python value: yaml-style booleans and null, numbers, lists, strings."""
    mapping = {"true": True, "false": False, "null": None, "None": None, "True": True, "False": False}
    if text in mapping:
        return mapping[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def same_value(a, b) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return a == b


def dataclass_fields(cls, prefix: str) -> dict[str, object]:
    """``{dotted key: default}`` of a config dataclass, nested dataclasses flattened, private fields left out."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out.update(dataclass_fields(type(default), f"{prefix}.{f.name}"))
        else:
            out[f"{prefix}.{f.name}"] = default
    return out


def option_rows(page: Path) -> list[tuple[str, str]]:
    """``(key, default)`` of every row of the page's ``| key | default | meaning |`` tables."""
    rows = []
    for header, body in tables(page.read_text()):
        if [h.lower() for h in header[:2]] == ["key", "default"]:
            for cells in body:
                key, default = _code(cells[0]), _code(cells[1])
                assert key and default is not None, f"{_rel(page)}: row {cells[:2]}: key and default as `code`"
                rows.append((key, default))
    return rows


def _methods():
    from verl_ext.methods import METHODS

    return METHODS


def _method_pages():
    return sorted((ROOT / "docs/algo").glob("*.md"))


def test_every_method_has_a_page():
    """Each of the toolkit's methods (not the registry, where tests register stand-ins) has its page, and each page
    is a method's."""
    from verl_ext.method_names import TOOLKIT_METHODS

    names = {"diva_grpo", *TOOLKIT_METHODS}
    pages = {p.stem for p in _method_pages()}
    assert sorted(names - pages) == [], f"no docs/algo/<name>.md for {sorted(names - pages)}"
    assert sorted(pages - names) == [], f"docs/algo pages of no method: {sorted(pages - names)}"


def test_readme_fidelity_table_has_every_method_and_each_page_its_section():
    """The README's fidelity table names each method of its methods table that has a page, and each page says its
    fidelity point by point."""
    readme = (ROOT / "README.md").read_text()
    found = {tuple(h.lower() for h in header[:2]): body for header, body in tables(readme)}
    with_page = {cells[0] for cells in found[("method", "what it changes")] if "docs/algo/" in cells[-1]}
    fidelity = {cells[0] for cells in found[("method", "follows")]}
    missing, extra = sorted(with_page - fidelity), sorted(fidelity - with_page)
    assert not missing and not extra, f"README's fidelity table: missing {missing}, rows of no method {extra}"
    for page in _method_pages():
        assert re.search(r"^## Fidelity", page.read_text(), re.M), f"{_rel(page)}: no '## Fidelity' section"


@pytest.mark.parametrize("page", _method_pages(), ids=lambda p: p.stem)
def test_option_table_is_the_config(page):
    method = _methods()[page.stem]
    documented = option_rows(page)
    if method.config_cls is None:
        assert documented == [], f"{_rel(page)}: {page.stem} has no config block"
        return
    fields = dataclass_fields(method.config_cls, method.key)
    keys = [key for key, _ in documented]
    problems = [f"{k} documented twice" for k in sorted({k for k in keys if keys.count(k) > 1})]
    problems += [f"{k} is not documented" for k in fields if k not in keys]
    problems += [f"{k} is not a field of {method.config_cls.__name__}" for k in keys if k not in fields]
    config_yaml = yaml.safe_load((ROOT / "recipe/diva_grpo/config/diva_grpo.yaml").read_text())
    for key, text in documented:
        if key not in fields:
            continue
        value = parse_default(text)
        if not same_value(value, fields[key]):
            problems.append(f"{key}: documented {text}, {method.config_cls.__name__} says {fields[key]!r}")
        try:
            in_yaml = _lookup(config_yaml, key)
        except KeyError:
            problems.append(f"{key} is not in recipe/diva_grpo/config/diva_grpo.yaml")
            continue
        if not same_value(value, in_yaml):
            problems.append(f"{key}: documented {text}, the yaml says {in_yaml!r}")
    assert problems == [], f"{_rel(page)}: " + "; ".join(problems)


def _named_tables(kind: str):
    """``(page, target named in the header, rows)`` of the tables whose first header cell is ``kind (`target`)``."""
    for page in PAGES:
        for header, rows in tables(page.read_text()):
            match = re.fullmatch(kind + r" \(`([^`]+)`\)", header[0])
            if match:
                yield page, match.group(1), rows


def test_variable_tables_name_what_the_launcher_reads():
    problems, seen = [], 0
    for page, script, rows in _named_tables("variable"):
        if not (ROOT / script).is_file():
            problems.append(f"{_rel(page)}: no file {script}")
            continue
        known = script_env_names(script) | python_env_names()
        for cells in rows:
            seen += 1
            name = _code(cells[0])
            if name is None or name not in known:
                problems.append(f"{_rel(page)}: {script} reads no variable {cells[0]}")
                continue
            documented, default = _code(cells[1]), script_default(script, name)
            if documented is not None and default is not None and documented != default:
                problems.append(f"{_rel(page)}: {name} defaults to {default!r} in {script}, documented {documented!r}")
    assert seen > 0
    assert problems == [], "\n".join(problems)


def test_cli_option_tables_name_real_options():
    problems, seen = [], 0
    for page, command, rows in _named_tables("option"):
        words = command.split()
        assert words[0] == "diva-prep", f"{_rel(page)}: option tables of {words[0]} are not checked"
        parser = _diva_prep_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[words[1]]
        actions = {s: a for a in sub._actions for s in a.option_strings}
        for cells in rows:
            seen += 1
            option, documented = _code(cells[0]), _code(cells[1])
            if option not in actions:
                problems.append(f"{_rel(page)}: {command} has no option {cells[0]}")
            elif documented is not None and not same_value(parse_default(documented), actions[option].default):
                problems.append(f"{_rel(page)}: {command} {option} defaults to {actions[option].default!r}")
    assert seen > 0
    assert problems == [], "\n".join(problems)


def test_reward_kwargs_table_is_compute_score():
    from verl_ext.reward import compute_score

    parameters = inspect.signature(compute_score).parameters
    problems, seen = [], 0
    for page in PAGES:
        for header, rows in tables(page.read_text()):
            if header[0] != "reward_kwargs key":
                continue
            for cells in rows:
                seen += 1
                name, documented = _code(cells[0]), _code(cells[1])
                if name not in parameters:
                    problems.append(f"{_rel(page)}: compute_score takes no {cells[0]}")
                elif not same_value(parse_default(documented), parameters[name].default):
                    problems.append(f"{_rel(page)}: {name} defaults to {parameters[name].default!r}")
    # every keyword of the reward's own (verl's call passes data_source, solution_str, ground_truth, extra_info)
    own = [n for n, p in parameters.items() if p.default is not inspect.Parameter.empty and n != "extra_info"]
    assert seen == len(own), f"the reward_kwargs table must list each of {own}"
    assert problems == [], "\n".join(problems)


# ----------------------------------------------------------------------------------------------- the rest


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_resolve(page):
    text = page.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            problems.append(f"{target}: no heading with that anchor")
    assert problems == [], f"{_rel(page)}: " + "; ".join(problems)


def test_readme_keeps_ci_commands_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    first = fenced_blocks(readme)[0][2]
    assert README_COMMAND_1 in first.splitlines(), "README's first block must hold command 1 as CI runs it"
    assert README_GPU_STACK in readme.splitlines()
    lines = len(readme.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail to a page of docs/"


# ------------------------------------------------------------------------------------- the checks can fail


BROKEN_BLOCKS = [
    ("bash run_scripts/no_such_launcher.sh", "no file"),
    ("ROLOUT=vllm bash run_scripts/tiny_cpu.sh", "reads no variable ROLOUT"),
    ("bash run_scripts/qwen25vl7b_diva.sh diva.advantage.kk=0.2", "Hydra key 'diva.advantage.kk'"),
    ("diva-prep convert --input a --layout nope --output b", "rejects"),
    ("diva-prep variants --input a --output b --model m --concurency 4", "rejects"),
    ("diva-report run --outptu x", "rejects"),
    ("python -m verl_ext.checks.same_run a b --strict", "has no option --strict"),
    ("python benchmarks/bench_variants.py --quik", "has no option --quik"),
    ("python -m no_such_module_here", "no module"),
    ('pip install -e ".[tests]"', "no extra 'tests'"),
    ("python - <<'EOF'\nprint(1\nEOF", "does not compile"),
]


@pytest.mark.parametrize("body, expected", BROKEN_BLOCKS)
def test_a_broken_command_is_caught(body, expected):
    problems = [p for env, words, heredoc in commands(body + "\n") for p in check_command(env, words, heredoc)]
    assert any(expected in p for p in problems), problems


def test_a_wrong_option_table_is_caught(tmp_path, monkeypatch):
    page = ROOT / "docs/algo/avspo.md"
    text = page.read_text()
    wrong = text.replace("| `avspo.alpha` | `0.5` |", "| `avspo.alpha` | `0.6` |").replace(
        "| `avspo.anchor` |", "| `avspo.anchr` |"
    )
    assert wrong != text
    copy = tmp_path / "avspo.md"
    copy.write_text(wrong)
    with pytest.raises(AssertionError) as err:
        test_option_table_is_the_config(copy)
    for expected in ("avspo.alpha: documented 0.6", "avspo.anchor is not documented", "avspo.anchr is not a field"):
        assert expected in str(err.value)


def test_an_unparsable_block_is_caught():
    assert subprocess.run(["bash", "-n"], input='echo "unclosed\n', capture_output=True, text=True).returncode != 0


def test_a_missing_anchor_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[x](#no-such-heading) [y](missing.md)\n")
    with pytest.raises(AssertionError) as err:
        test_links_resolve(page)
    assert "no heading" in str(err.value) and "no such file" in str(err.value)
