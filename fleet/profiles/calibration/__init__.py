"""Published figures the default profile is calibrated against (a copy of ../shared/calibration)."""
