"""``launch`` and ``LaunchConfig``: starting a server from Python with ``genrec serve``'s
options, refused before anything loads when they conflict or leave an open address without a
key. (``tests/test_commands_serve.py`` runs real servers through it.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from genrec.serving.launch import LaunchConfig, launch
from genrec.serving.spec import AppSpec, ServeConfig


def test_conflicting_settings_are_named() -> None:
    assert LaunchConfig().conflict(ServeConfig()) is None
    assert LaunchConfig(ray=True, replicas=3).conflict(ServeConfig()) is None
    assert LaunchConfig(replicas=2).conflict(ServeConfig()) == "--replicas needs --ray"
    conflict = LaunchConfig(ray=True).conflict(ServeConfig(engine_process=True))
    assert conflict is not None and "--engine-process" in conflict


def test_an_open_address_needs_a_key_or_allow_insecure() -> None:
    assert LaunchConfig().bind_warning(ServeConfig()) is None
    assert LaunchConfig(host="0.0.0.0").bind_warning(ServeConfig(api_key="k")) is None
    with pytest.raises(ValueError, match="without an API key"):
        LaunchConfig(host="0.0.0.0").bind_warning(ServeConfig())
    warning = LaunchConfig(host="0.0.0.0", allow_insecure=True).bind_warning(ServeConfig())
    assert warning is not None and warning.startswith("WARNING")


@pytest.mark.parametrize("server, config, message", [
    (LaunchConfig(replicas=2), ServeConfig(), "--replicas needs --ray"),
    (LaunchConfig(host="0.0.0.0"), ServeConfig(), "without an API key"),
])
def test_launch_refuses_before_loading(tmp_path: Path, server: LaunchConfig,
                                       config: ServeConfig, message: str) -> None:
    spec = AppSpec.of(tmp_path / "no-model", config=config)  # would fail to load
    with pytest.raises(ValueError, match=message):
        launch(spec, server)


def test_launch_with_ray_checks_ray_then_the_paths(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = AppSpec.of(tmp_path / "no-model")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
        patch.setitem(sys.modules, "ray.serve", None)
        with pytest.raises(ImportError, match=r"pip install 'genrec\[ray\]'"):
            launch(spec, LaunchConfig(ray=True))
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match="no config.json"):
        launch(spec, LaunchConfig(ray=True))


def test_launch_fails_on_a_model_that_does_not_load(tmp_path: Path) -> None:
    with pytest.raises((ValueError, RuntimeError, OSError)):
        launch(AppSpec.of(tmp_path / "no-model"), LaunchConfig())
