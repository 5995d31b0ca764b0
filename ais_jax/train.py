"""`python -m ais_jax.train`: the training CLI (docs/configuration.md); the code is
`ais_jax.run.cli`."""

import sys

from ais_jax.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
