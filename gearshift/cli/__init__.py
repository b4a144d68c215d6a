"""The ``gearshift`` command line, one module per command or command group (``app`` wires them)."""
