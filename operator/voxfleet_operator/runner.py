"""`voxfleet operator`: kopf's run loop with voxfleet's handlers and settings."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from voxfleet_operator.config import WATCH_NAMESPACES_ENV


def watched_namespaces(cli: list[str] | None) -> list[str]:
    if cli:
        return cli
    raw = os.environ.get(WATCH_NAMESPACES_ENV, "")
    return [n.strip() for n in raw.split(",") if n.strip()]


def run_operator(
    namespaces: list[str] | None = None, verbose: bool = False, liveness: str | None = None
) -> int:
    import kopf

    from voxfleet_operator.config import ConfigError, load_config
    from voxfleet_operator.handlers import build_registry
    from voxfleet_operator.pools import PoolsConfigError

    # Fail before connecting anywhere when the configuration is wrong, with the reason.
    try:
        load_config()
        registry = build_registry()
    except (ConfigError, PoolsConfigError, ValueError) as error:
        print(f"voxfleet operator: {error}", file=sys.stderr)
        return 2

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    watched = watched_namespaces(namespaces)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,  # one replica with a Recreate strategy: no peering needed
            clusterwide=not watched,
            namespaces=watched,
            liveness_endpoint=liveness,
        )
    )
    return 0
