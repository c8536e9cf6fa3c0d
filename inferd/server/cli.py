"""`inferd serve`: run the control plane: management API, gateway, registry, replicas.

One flag per setting (`--max-replicas-cap`, ...), generated from `Settings`
so none is forgotten; flags win over `INFERD_*` variables, which win over
the `--config` file. uvicorn handles SIGINT/SIGTERM: it stops accepting,
finishes in-flight requests, runs the lifespan shutdown, and returns.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import logging.config
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any

from inferd import __version__
from inferd.settings import Settings, SettingsError, load_settings, setting_keys

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the control plane: management API, gateway and replicas",
        description="Run the inferd control plane. Settings: built-in defaults < --config "
        "file < INFERD_* environment < these flags (see configs/server.yaml).",
    )
    parser.add_argument("--config", help="YAML settings file (default: $INFERD_CONFIG)")
    parser.add_argument(
        "--rotate-admin-key",
        action="store_true",
        help="generate a new admin key (printed once) and revoke the stored ones",
    )
    for key in setting_keys():
        field = Settings.model_fields[key]
        parser.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            default=None,
            metavar=key.split("_")[-1].upper(),
            help=field.description or f"(setting {key})",
        )
    parser.set_defaults(func=run)


def _log_config(level: str) -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    # Redact anything token-shaped on every handler, whoever logs it.
    config["filters"] = {
        "redact": {"()": "inferd.redact.RedactingFilter"},
        "quiet_reports": {"()": "inferd.server.access_log.QuietReplicaReports"},
    }
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["handlers"]["access"]["filters"] = ["quiet_reports", "redact"]
    config["loggers"]["inferd"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    config["root"] = {"handlers": ["default"], "level": "WARNING"}
    return config


def _banner(
    settings: Settings,
    state: str,
    generated_key: str | None,
    *,
    replicas: str = "",
    admin_key_source: str | None = None,
) -> str:
    url = settings.public_url
    lines = [
        f"inferd {__version__} control plane",
        f"  management API  {url}/inference  (OpenAPI: {url}/openapi.json)",
        f"  web console     {url}/console/",
        f"  endpoint URLs   {url}/endpoints/<id>",
        f"  state           {state}",
    ]
    if replicas:
        lines.append(f"  replicas        {replicas}")
    if settings.launcher == "local":
        lines.append(f"  replica logs    {settings.state_dir / 'logs'}/replica-<id>.log")
    if admin_key_source is not None:
        # Said out loud: a key exported for the CLI in this shell is taken by
        # the server too, and then the stored (printed) key does not open it.
        lines.append(
            f"  admin key       the one in {admin_key_source}; the stored keys do not "
            "open the API while it is set"
        )
    elif generated_key is None:
        # A restart: the key printed at first start still opens the API.
        lines.append(
            "  admin key       the one printed at first start (only its hash is kept); "
            "lost it? `inferd serve --rotate-admin-key` prints a new one and revokes it"
        )
    if generated_key is not None:
        lines += [
            "",
            "Admin key (shown only this once; inferd keeps only its hash;",
            "`inferd serve --rotate-admin-key` replaces a lost one):",
            f"  {generated_key}",
            "Use it as the bearer token of the management API, e.g.",
            f"  export INFERD_ADMIN_KEY={generated_key}",
            f"  export INFERD_API_URL={url}",
            "",
        ]
    return "\n".join(lines)


def admin_key_source(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """Where the operator's admin key comes from, or None (generated and stored)."""
    if getattr(args, "admin_key", None):
        return "--admin-key"
    if env.get("INFERD_ADMIN_KEY"):
        return "the environment (INFERD_ADMIN_KEY)"
    return None


def _stopped(signum: int, frame: FrameType | None) -> None:
    logger.info("stopped by %s", signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, key, None) for key in setting_keys()}
    try:
        # The one place the real environment is read: at run time, passed in.
        settings = load_settings(env=os.environ, config_path=args.config, overrides=overrides)
    except SettingsError as exc:
        print(f"inferd serve: {exc}", file=sys.stderr)
        return 2
    key_source = admin_key_source(args, os.environ)
    if key_source is None and settings.admin_key is not None:
        key_source = "the config file (admin_key)"
    if args.rotate_admin_key and key_source is not None:
        print(
            f"inferd serve: --rotate-admin-key replaces the stored (generated) admin key, but "
            f"the admin key is set in {key_source}: unset it to use and rotate the stored one",
            file=sys.stderr,
        )
        return 2
    log_config = _log_config(settings.log_level)
    logging.config.dictConfig(log_config)
    # One event loop for everything: the store's change-feed followers run
    # in the loop that serves.
    return asyncio.run(
        _serve(settings, log_config, rotate_admin_key=args.rotate_admin_key, key_source=key_source)
    )


async def _serve(
    settings: Settings,
    log_config: dict[str, Any],
    *,
    rotate_admin_key: bool,
    key_source: str | None = None,
) -> int:
    import uvicorn

    from inferd.catalog import CatalogError
    from inferd.control.model import StoreError, StoreUnavailable
    from inferd.control.stores import redact_url
    from inferd.http_limits import limited_protocol
    from inferd.server.app import create_app
    from inferd.server.auth import AdminKeyError
    from inferd.server.compose import LauncherUnavailable, build

    try:
        built = await build(settings, rotate_admin_key=rotate_admin_key)
    except (AdminKeyError, LauncherUnavailable) as exc:
        print(f"inferd serve: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"inferd serve: {exc.detail or exc.message}", file=sys.stderr)
        return 1
    except (StoreError, CatalogError) as exc:
        print(f"inferd serve: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = redact_url(settings.database_url)
        print(f"inferd serve: cannot open the state in {where}: {exc}", file=sys.stderr)
        return 1
    try:
        describe = getattr(built.launcher, "describe", None)
        banner = _banner(
            settings,
            built.store.describe(),
            built.generated_admin_key,
            replicas=describe() if describe is not None else f"{settings.launcher} launcher",
            admin_key_source=key_source,
        )
        print(banner, flush=True)
        app = create_app(built)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_config=log_config,
            log_level=settings.log_level,
            lifespan="on",
            server_header=False,
            http=limited_protocol(settings.request_timeout_seconds, settings.max_connections),
            # Forwarded headers are not trusted: inferd is not behind a proxy
            # by default, and the admin surface must not believe a spoofed IP.
            proxy_headers=False,
            # In-flight requests (streams included) get this long to finish
            # after a stop is requested; replicas then drain as well.
            timeout_graceful_shutdown=int(settings.replica_drain_timeout_seconds) or None,
        )
        server = uvicorn.Server(config)
        # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the
        # signal into the handler that was installed before it ran. Make that
        # a no-op, so a requested stop ends here with status 0 (after the
        # store is closed) instead of dying by the signal.
        previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            await server.serve()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0 if server.started else 1
    finally:
        await built.close()
