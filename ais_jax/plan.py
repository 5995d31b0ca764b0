"""`python -m ais_jax.plan`: will a config fit? per-device memory from ahead-of-time compiles; the
code is `ais_jax.run.plan`."""

import sys

from ais_jax.run.plan import main

if __name__ == "__main__":
    sys.exit(main())
