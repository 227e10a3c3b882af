"""`python -m specsim ...` runs the command line (the same as the `specsim` script)."""

from specsim.cli import main

main()
