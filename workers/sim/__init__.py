"""The simulated vLLM worker and the virtual-time lab. ``workers.sim.native`` may have compiled some of its modules
(``python -m workers.sim.native build``): they are loaded instead of the sources only while those are unchanged;
``GEARSHIFT_LAB_NATIVE=0`` loads the sources regardless."""

import os

from workers.sim.native import NATIVE_DIR, usable

if os.environ.get("GEARSHIFT_LAB_NATIVE", "1") != "0" and usable()[0]:
    __path__.insert(0, str(NATIVE_DIR))
