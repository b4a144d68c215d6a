"""The policy lab: speculation policies on scenarios in virtual time, baselines, the oracle and the report."""
