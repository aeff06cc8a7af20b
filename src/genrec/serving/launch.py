"""Starting a server: :func:`launch` serves an :class:`~genrec.serving.spec.AppSpec` (what it
loads, with its :class:`~genrec.serving.spec.ServeConfig`) as a :class:`LaunchConfig` says
(where it listens; one process or Ray Serve replicas). ``genrec serve`` fills the three from
its flags; Python code can do the same::

    from genrec.serving.launch import LaunchConfig, launch
    from genrec.serving.spec import AppSpec, ServeConfig
    launch(AppSpec.of("ckpt", config=ServeConfig(max_batch_size=64)), LaunchConfig(port=8080))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from genrec.serving.auth import check_bind
from genrec.serving.spec import AppSpec, ServeConfig


@dataclass(frozen=True)
class LaunchConfig:
    """How a server starts: the address it listens on, uvicorn's ``log_level``, one process
    or ``replicas`` Ray Serve replicas (``ray``), and ``allow_insecure``: a non-loopback
    ``host`` without an API key (refused otherwise)."""

    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    ray: bool = False
    replicas: int = 1
    allow_insecure: bool = False

    def conflict(self, config: ServeConfig) -> str | None:
        """What in these settings and ``config`` cannot go together (naming the flags), or
        ``None``."""
        if self.replicas != 1 and not self.ray:
            return "--replicas needs --ray"
        if config.engine_process and self.ray:
            return "--engine-process is for the single-process server, not --ray"
        return None

    def bind_warning(self, config: ServeConfig) -> str | None:
        """``ValueError`` when ``host`` may not be served with ``config``'s keys
        (:func:`~genrec.serving.auth.check_bind`); the warning to show when only
        ``allow_insecure`` allows it; else ``None``."""
        return check_bind(self.host, config.api_key, config.admin_key, self.allow_insecure)


def launch(spec: AppSpec, server: LaunchConfig, echo: Callable[[str], None] = print) -> None:
    """Serve ``spec`` as ``server`` says until SIGTERM / SIGINT, then drain and return;
    ``echo`` gets the Ray Serve status lines (the caller shows
    :meth:`LaunchConfig.bind_warning`).

    Raises ValueError for conflicting settings, a refused address or (with Ray) a missing
    path; ImportError without Ray Serve; RuntimeError / OSError when the model does not load
    (with Ray: any error of a replica that fails to start).
    """
    if (conflict := server.conflict(spec.config)) is not None:
        raise ValueError(conflict)
    server.bind_warning(spec.config)
    if server.ray:
        launch_ray(spec, server, echo)
        return
    from genrec.serving.app_loader import load_app
    from genrec.serving.uvicorn_server import run_server

    run_server(load_app(spec), host=server.host, port=server.port, log_level=server.log_level)


def launch_ray(spec: AppSpec, server: LaunchConfig, echo: Callable[[str], None]) -> None:
    """``spec`` in ``server.replicas`` Ray Serve replicas until SIGINT / SIGTERM (its paths
    checked before Ray starts)."""
    from genrec.serving import ray_app

    try:
        from ray import serve as ray_serve  # noqa: F401
    except ImportError as err:
        raise ImportError(f"{ray_app.RAY_MISSING} ({err})") from None
    spec.check()
    ray_app.run(spec, server.replicas, server.host, server.port, echo=echo)
