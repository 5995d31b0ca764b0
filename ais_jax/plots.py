"""`python -m ais_jax.plots`: PNG training curves from a run's metrics.jsonl; the code is
`ais_jax.run.plots`."""

import sys

from ais_jax.run.plots import main

if __name__ == "__main__":
    sys.exit(main())
