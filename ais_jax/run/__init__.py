"""Runs: the command-line programs and what only a run on disk needs.

Holds the training CLI and loop (`cli`), the run guard (`runguard`: lock, resume checks,
metrics repair), process settings (`runtime`), train-state checkpoints (`checkpoint`), trackers
(`trackers`), the memory planner (`plan`, `plan_report`), the mismatch CLI (`mismatch`,
`mismatch_report`, `llada_mismatch`) and training curves (`plots`). May import every layer; the
top-level entry modules (`python -m ais_jax.train | plan | mismatch | plots`) are thin wrappers
of these.
"""
