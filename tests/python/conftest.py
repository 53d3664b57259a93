"""Fixtures shared by every Python test: the Redis servers (see redis_servers.py)."""

pytest_plugins = ["redis_servers"]
