"""The layers the folders show, enforced: what each layer may import, no cycles, small files.

core/      pure torch            -> nothing above it
engine/    the policy's forwards -> core (the fast paths, their checks, the rollout copy)
rollout/   group sampling        -> core, engine
training/  trainer and its glue  -> core, engine, rollout, reward_fns, models; inside it, rooms by
                                    concern on a ladder (TRAINING_ROOMS)
app/       recipes, card, hub    -> everything below
cli.py     argument parsing      -> imported by nothing in the library
reward_fns never imports grpo_plugin (third parties import it alone).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO_ROOT, load_script

PACKAGE = REPO_ROOT / "grpo_plugin"
LAYER_MAY_IMPORT = {
    "core": {"core", "_compat", "_logging"},
    "engine": {"core", "engine", "_compat", "_logging"},
    "rollout": {"core", "engine", "rollout", "_compat", "_logging"},
    "training": {
        "core",
        "engine",
        "rollout",
        "training",
        "_compat",
        "_logging",
        "_version",
        "models",
    },
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every grpo_plugin / reward_fns module `path` imports (at any depth)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("grpo_plugin", "reward_fns")}


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("layer", sorted(LAYER_MAY_IMPORT))
def test_each_layer_imports_only_what_is_below_it(layer):
    for path in _sources(PACKAGE / layer):
        rel = path.relative_to(PACKAGE).as_posix()
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "grpo_plugin" or len(parts) == 1:
                continue
            assert parts[1] in LAYER_MAY_IMPORT[layer], f"{rel} imports {name}"


def test_reward_fns_never_imports_grpo_plugin():
    for path in _sources(REPO_ROOT / "reward_fns"):
        assert not [n for n in _imports(path) if n.startswith("grpo_plugin")], path


def test_nothing_imports_the_cli():
    for path in _sources(PACKAGE):
        if path.name not in ("cli.py", "__main__.py"):
            assert "grpo_plugin.cli" not in _imports(path), path


def test_no_import_cycles():
    modules = {_module_name(p): p for p in _sources(PACKAGE)}
    graph = {
        name: {dep for dep in _imports(path) if dep in modules and dep != name}
        for name, path in modules.items()
    }
    graph["grpo_plugin"] = set()  # the package root only re-exports, lazily
    visiting, done = set(), set()

    def visit(node: str, chain: list[str]) -> None:
        assert node not in visiting, " -> ".join(chain + [node])
        if node in done:
            return
        visiting.add(node)
        for dep in graph[node]:
            visit(dep, chain + [node])
        visiting.discard(node)
        done.add(node)

    for name in graph:
        visit(name, [])


# --- training/'s rooms ---------------------------------------------------------------------------
# Each subpackage or top-level module of training/ is a room that owns one concern. Bottom to top,
# each imports only rooms listed before it (and the layers below training/): the rooms form a
# ladder, never a cycle. A new import between rooms is an edit here, made on purpose.
TRAINING_ROOMS: list[tuple[str, set[str], str]] = [
    ("config", set(), "GRPOConfig and its cross-field checks"),
    ("hub_access", set(), "whether the Hugging Face Hub can be reached, asked before fetching"),
    ("model_checks", set(), "the policy's setup (LoRA, a rollout copy) checked before it loads"),
    ("weight_files", set(), "a local model or adapter folder's weight files, whole, unloaded"),
    ("user_code", set(), "the user's callables: 'module:function', 'file.py:function'"),
    ("distributed", set(), "processes: shards, gathers, launch checks"),
    ("metrics", set(), "the metrics window, zero-std watch, TRL-named reward metrics"),
    ("policy", {"model_checks"}, "loading the policy, reference, LoRA / QLoRA"),
    ("cpu_threads", set(), "torch's CPU threads for a run: the free cores, kept on resume"),
    ("liger", set(), "use_liger_kernel, decided per case with TRL's reasons"),
    (
        "rewards",
        {"config", "distributed", "user_code"},
        "reward functions and models, the scorer and its watchdog",
    ),
    (
        "trl_attributes",
        {"distributed", "rewards"},
        "TRL's public trainer attributes (views of the config) and helpers",
    ),
    (
        "run",
        {"cpu_threads", "distributed", "metrics", "rewards"},
        "the run dir, checkpoints, resume, RunState",
    ),
    ("progress", set(), "what a person sees while a run works: live lines or plain ones"),
    ("callbacks", {"policy", "progress", "run"}, "progress, metrics.jsonl, reference syncing"),
    ("objective", {"distributed", "policy", "run"}, "advantages, the loss and its extras"),
    (
        "evaluation",
        {"callbacks", "distributed", "metrics", "objective", "policy", "rewards", "user_code"},
        "the one evaluation engine, eval sets and schedule, the reward-hacking watch",
    ),
    (
        "sampling",
        {"evaluation", "rewards", "user_code"},
        "the rollout sampler, tools, streamed data",
    ),
    (
        "inputs",
        {"distributed", "evaluation", "hub_access", "run", "sampling", "weight_files"},
        "the trainer's inputs, checked once",
    ),
    ("autopilot", {"inputs", "run", "sampling"}, "the memory autopilot"),
    ("loaders", {"sampling"}, "the train sampler and data loaders, as TRL's"),
    (
        "publish",
        {"evaluation", "inputs", "policy", "run"},
        "the model card, its plots, the Hub, GGUF",
    ),
    ("trainer", {"*"}, "GRPOTrainer: orchestration, imports any room"),
]


def _room(path: Path) -> str:
    parts = path.relative_to(PACKAGE / "training").parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def test_training_rooms_form_a_ladder_and_every_room_is_listed():
    order = [name for name, _, _ in TRAINING_ROOMS]
    for i, (name, may, _) in enumerate(TRAINING_ROOMS):
        assert may <= set(order[:i]) or may == {"*"}, f"{name} may import a room above it"
    present = {_room(p) for p in _sources(PACKAGE / "training")} - {"__init__"}
    assert present == set(order), "give each room of training/ a line in TRAINING_ROOMS"


def test_each_training_room_imports_only_the_rooms_below_it():
    allowed = {name: may for name, may, _ in TRAINING_ROOMS}
    for path in _sources(PACKAGE / "training"):
        room = _room(path)
        for name in _imports(path):
            parts = name.split(".")
            if parts[:2] != ["grpo_plugin", "training"] or len(parts) < 3 or parts[2] == room:
                continue
            if room != "__init__" and allowed[room] != {"*"}:
                rel = path.relative_to(PACKAGE).as_posix()
                assert parts[2] in allowed[room], f"{rel} imports {name}"


# A declarative config may exceed the bound: GRPOConfig is one field list grouped by concern, and
# it grows with the options. We don't split a file by size; its checks (config/checks.py) stay
# under the bound like any code.
EXEMPT_FROM_SIZE = {"grpo_plugin/training/config/grpo_config.py"}


def test_no_file_over_about_400_lines():
    big = {
        rel: n
        for folder in ("grpo_plugin", "reward_fns", "recipes")
        for p in _sources(REPO_ROOT / folder)
        if (rel := p.relative_to(REPO_ROOT).as_posix()) not in EXEMPT_FROM_SIZE
        and (n := len(p.read_text().splitlines())) > 450
    }
    assert big == {}


def test_no_formatter_escapes_in_the_library():
    """Long argument lists get a parameters object or keywords, not `# fmt: skip`."""
    escaped = [
        p.relative_to(REPO_ROOT).as_posix()
        for folder in ("grpo_plugin", "reward_fns")
        for p in _sources(REPO_ROOT / folder)
        if "fmt: skip" in p.read_text() or "fmt: off" in p.read_text()
    ]
    assert escaped == []


# --- parameter counts ---------------------------------------------------------------------------
# A function's parameters: positional-only, positional and keyword-only ones, without a leading
# `self` / `cls`; `*args` and `**kwargs` count one each (a caller can still pass through them,
# so they are part of what a call may carry). More than MAX_PARAMETERS wants a parameter object
# (`rollout/types.py`: GenerationRequest, DecodeSpec, GroupSampling) unless listed here.
MAX_PARAMETERS = 6
MANY_PARAMETERS_ALLOWED = {
    "training/trainer.py::GRPOTrainer.__init__": "TRL's public GRPOTrainer signature, kept so "
    "TRL scripts run unchanged",
}


def test_no_function_takes_more_than_six_parameters():
    # one counting rule: benchmarks/function_stats.py reports the same numbers
    stats = load_script(REPO_ROOT / "benchmarks" / "function_stats.py", "function_stats")
    counts = {
        f"{where.split(':')[0].removeprefix('grpo_plugin/')}::{name}": params
        for name, where, _, params in stats.functions()
    }
    wide = {name: n for name, n in counts.items() if n > MAX_PARAMETERS}
    unlisted = {name: n for name, n in wide.items() if name not in MANY_PARAMETERS_ALLOWED}
    assert unlisted == {}, "add a parameter object (or, with a reason, an allow-list entry)"
    stale = sorted(set(MANY_PARAMETERS_ALLOWED) - set(wide))
    assert stale == [], "these are within the limit now: drop them from the allow-list"


# --- no private reads --------------------------------------------------------------------------
# Outside engine/ and _compat/ (where library internals are read on purpose, each with a row in
# _compat's table), code uses what others make public: no `obj._name` but on `self`, `cls` or
# `super()`, and no `getattr(obj, "_name")`. Dunders are public. The allow-list holds names that
# are private-looking but documented public API.
INTERNALS_ALLOWED_IN = {"engine", "_compat"}
# files that move into engine/ (the forward engine's branch): drop each entry when it moves
PUBLIC_BY_DOCUMENTATION = {"os._exit", "sys._getframe"}
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """`(line, what)` of each private attribute this module reaches on another object."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                continue
            what = f"{ast.unparse(owner)}.{node.attr}"
            if what not in PUBLIC_BY_DOCUMENTATION:
                found.append((node.lineno, what))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ATTRIBUTE_FUNCTIONS:
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if _is_private(name.value):
                    found.append((node.lineno, f"{node.func.id}(..., {name.value!r})"))
    return sorted(found)


def test_no_private_reads_outside_engine_and_compat():
    reads = [
        f"{rel}:{line} {what}"
        for path in _sources(PACKAGE)
        if (rel := path.relative_to(PACKAGE).as_posix()).split("/")[0] not in INTERNALS_ALLOWED_IN
        for line, what in _private_reads(ast.parse(path.read_text()))
    ]
    assert reads == [], "use a public API, or a helper in grpo_plugin/_compat with its table row"


def test_the_private_read_walk_sees_what_it_must():
    source = (
        "a._x\nself._y\ncls._z\nsuper()._w\nb.__len__\nos._exit(0)\n"
        "getattr(m, '_p', None)\nhasattr(m, 'q')\nsetattr(m, '_r', 1)\nc.d._e = 2\n"
    )
    assert _private_reads(ast.parse(source)) == [
        (1, "a._x"),
        (7, "getattr(..., '_p')"),
        (9, "setattr(..., '_r')"),
        (10, "c.d._e"),
    ]
