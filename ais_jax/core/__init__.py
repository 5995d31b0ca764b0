"""Foundations every layer may use: the user-error types and the bounded YAML reader.

Holds `errors` (`UsageError`, `CheckpointError`: one-line user errors the CLIs turn into exit
status 2) and `safe_yaml` (YAML without anchors, aliases, duplicate keys or deep nesting; value
clipping for messages). May import nothing from `ais_jax`.
"""
