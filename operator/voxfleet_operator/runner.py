"""`voxfleet operator`: kopf's run loop with voxfleet's handlers and settings."""

from __future__ import annotations

import asyncio
import logging
import sys


def run_operator(
    namespaces: list[str] | None = None, verbose: bool = False, liveness: str | None = None
) -> int:
    import kopf

    from voxfleet_operator.config import ConfigError, load_config
    from voxfleet_operator.handlers import build_registry
    from voxfleet_operator.pools import PoolsConfigError

    # Fail before connecting anywhere when the configuration is wrong, with the reason.
    try:
        config = load_config()
    except (ConfigError, PoolsConfigError, ValueError) as error:
        print(f"voxfleet operator: {error}", file=sys.stderr)
        return 2
    registry = build_registry(config.resync_seconds)

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    watched = namespaces or list(config.watch_namespaces)
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
