"""A run's configuration: the schema, its YAML reading, its validation and `load_config`.

Holds `schema` (the frozen dataclasses and key choices), `yaml_io` (typing, overrides, printing,
field comments), `checks` (value ranges, paths and cross-field rules) and `load`
(`load_config`). May import `ais_jax.core` and `ais_jax.tasks` (task and reward names are
checked against them); nothing of models, rollout or training.
"""
