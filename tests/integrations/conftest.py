"""The trainer-integration tests drive the real server of tests/support/reward_servers.py."""

from support.reward_servers import (  # noqa: F401 (fixtures)
    direct_components,
    direct_scores,
    one_scorer_server,
    server,
    token_server,
)
