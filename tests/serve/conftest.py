"""tests/serve/test_unirl.py drives the real server of tests/support/reward_servers.py."""

from support.reward_servers import direct_components, direct_scores, server  # noqa: F401 (fixtures)
