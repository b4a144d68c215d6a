"""The reliability lab: ``gearshift bench soak`` (a real multi-process stack under load) and ``bench fuzz``."""
