"""The adaptive speculation controller and the cost-per-token model (DESIGN §5): sources → window →
estimator → policy → stabiliser → actuator, one leader through the store."""
