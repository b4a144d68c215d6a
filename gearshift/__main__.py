"""``python -m gearshift``: the same command line as the ``gearshift`` script."""

from gearshift.cli.app import main

main()
