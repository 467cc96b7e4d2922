"""reward_fns registry: registration, name resolution (incl. real entry points), calling."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading

import pytest

import reward_fns
from reward_fns import DuplicateRewardError, UnknownRewardError

BUILTINS = {
    "exact_integer",
    "last_integer",
    "gsm8k",
    "math",
    "think_format",
    "soft_overlong",
    "code_tests",
}


@pytest.fixture
def scratch_names():
    """Names registered by a test, removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        reward_fns.unregister(name)


def test_builtins_listed_with_docs():
    table = reward_fns.available()
    assert BUILTINS <= set(table)
    for name in BUILTINS:
        assert table[name] and "\n" not in table[name], name
        assert reward_fns.get(name).__name__ == name


def test_register_decorator_function_and_duplicates(scratch_names):
    scratch_names += ["t_decorated", "t_plain", "t_bare_reward"]

    @reward_fns.register("t_decorated")
    def one(prompts=None, completions=None, **kw):
        """Always one."""
        return [1.0] * len(completions)

    def two(prompts=None, completions=None, **kw):
        return [2.0] * len(completions)

    assert reward_fns.register("t_plain", two) is two

    @reward_fns.register
    def t_bare_reward(prompts=None, completions=None, **kw):
        return [0.0] * len(completions)

    assert reward_fns.get("t_decorated") is one
    assert reward_fns.get("t_plain") is two
    assert reward_fns.get("t_bare_reward") is t_bare_reward
    assert reward_fns.available()["t_decorated"] == "Always one."
    with pytest.raises(DuplicateRewardError, match="already registered.*override=True"):
        reward_fns.register("t_decorated", two)
    reward_fns.register("t_decorated", two, override=True)
    assert reward_fns.get("t_decorated") is two
    with pytest.raises(TypeError, match="callable"):
        reward_fns.register("t_plain2", 3)


def test_params_give_named_partial_and_typos_fail():
    fn = reward_fns.get("soft_overlong", max_completion_length=10, cache_length=4)
    assert fn.__name__ == "soft_overlong"
    assert fn(completions=["a"] * 2, completion_ids=[[0] * 6, [0] * 8]) == [0.0, -0.5]
    with pytest.raises(TypeError, match="max_completon_length.*accepts"):
        reward_fns.get("soft_overlong", max_completon_length=10)


def test_module_function_and_dotted_paths(tmp_path, monkeypatch):
    (tmp_path / "my_path_rewards.py").write_text(
        "def length_reward(prompts=None, completions=None, **kw):\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for path in ("my_path_rewards:length_reward", "my_path_rewards.length_reward"):
        fn = reward_fns.get(path)
        assert fn.__name__ == "length_reward"
        assert fn(completions=["ab", "abcd"]) == [2.0, 4.0]
    with pytest.raises(UnknownRewardError, match="no attribute 'nope'"):
        reward_fns.get("my_path_rewards:nope")


def test_unknown_name_lists_known_and_suggests():
    with pytest.raises(UnknownRewardError) as info:
        reward_fns.get("gsm8")
    message = str(info.value)
    assert "Did you mean 'gsm8k'?" in message
    assert "exact_integer" in message and "think_format" in message
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownRewardError):
        reward_fns.get("no_such_module_xyz:fn")


def test_entry_point_plugin_discovered_for_real(tmp_path, monkeypatch):
    """A real .dist-info with entry_points.txt on sys.path; importlib.metadata is not patched."""
    (tmp_path / "acme_rewards.py").write_text(
        textwrap.dedent('''
            def shout(prompts=None, completions=None, completion_ids=None, **kw):
                """1.0 when the completion is upper case."""
                return [float(c.isupper()) for c in completions]
        ''')
    )
    info = tmp_path / "acme_rewards-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-rewards\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[grpo_plugin.rewards]\nacme_shout = acme_rewards:shout\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = reward_fns.get("acme_shout")
    assert fn(completions=["HI", "hi"]) == [1.0, 0.0]
    assert fn.__name__ == "shout"
    assert "acme_shout" in reward_fns.available()
    assert "acme_shout" in reward_fns.format_registry()
    with pytest.raises(UnknownRewardError, match="Did you mean 'acme_shout'"):
        reward_fns.get("acme_shot")


def test_resolve_accepts_callables():
    def mine(prompts=None, completions=None, *, scale=1.0, **kw):
        return [scale] * len(completions)

    assert reward_fns.resolve(mine) is mine
    scaled = reward_fns.resolve(mine, scale=2.0)
    assert scaled.__name__ == "mine" and scaled(completions=["x"]) == [2.0]
    assert reward_fns.resolve("gsm8k") is reward_fns.get("gsm8k")


async def _async_reward(prompts=None, completions=None, **kw):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def test_async_rewards_stay_awaitable_and_call_reward_runs_both(scratch_names):
    scratch_names.append("t_async")
    reward_fns.register("t_async", _async_reward)
    fn = reward_fns.get("t_async")
    assert inspect.iscoroutinefunction(fn) and reward_fns.is_async_reward(fn)
    assert reward_fns.is_async_reward(reward_fns.configure(_async_reward, x=1))
    assert reward_fns.call_reward(fn, prompts=["p"], completions=["abc"]) == [3.0]
    sync = reward_fns.get("exact_integer")
    assert reward_fns.call_reward(sync, completions=["7"], answer=[7]) == [1.0]

    async def inside_running_loop():
        return reward_fns.call_reward(fn, completions=["ab", "a"])

    assert asyncio.run(inside_running_loop()) == [2.0, 1.0]
    out: dict = {}
    worker = threading.Thread(
        target=lambda: out.update(r=reward_fns.call_reward(fn, completions=["a"]))
    )
    worker.start()
    worker.join()
    assert out["r"] == [1.0]


def test_call_reward_checks_output():
    with pytest.raises(ValueError, match="returned 1 values for 2"):
        reward_fns.call_reward(lambda **kw: [1.0], completions=["a", "b"])
    with pytest.raises(TypeError, match="float or None"):
        reward_fns.call_reward(lambda **kw: ["yes"], completions=["a"])
    assert reward_fns.call_reward(lambda **kw: [1, None, True], completions="abc") == [
        1.0,
        None,
        1.0,
    ]


def test_completion_text_handles_chat_messages():
    chat = [
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "more?"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}],
        },
    ]
    assert reward_fns.completion_text(chat) == "42"
    assert reward_fns.completion_text([{"role": "user", "content": "u"}]) == "u"
    assert reward_fns.completion_text("plain") == "plain"
    assert reward_fns.get("exact_integer")(completions=[chat], answer=["42"]) == [1.0]


def test_cli_prints_registry_without_grpo_plugin():
    code = (
        "import runpy, sys; runpy.run_module('reward_fns', run_name='__main__'); "
        "assert 'grpo_plugin' not in sys.modules, 'reward_fns imported grpo_plugin'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for name in BUILTINS:
        assert name in result.stdout


def test_configured_reward_keeps_name_and_declared_columns():
    configured = reward_fns.get("code_tests", timeout_s=2.0)
    assert configured.__name__ == "code_tests"
    assert configured.required_columns == ("tests",)  # recipes check the dataset has them
