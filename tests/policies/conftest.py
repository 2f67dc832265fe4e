"""Fixtures of the policies tests: none needed beyond policy_replay helpers (policies are pure)."""
