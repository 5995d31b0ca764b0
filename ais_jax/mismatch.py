"""`python -m ais_jax.mismatch`: FP8-vs-BF16 mismatch diagnostics of a model; the code is
`ais_jax.run.mismatch`."""

import sys

from ais_jax.run.mismatch import main

if __name__ == "__main__":
    sys.exit(main())
