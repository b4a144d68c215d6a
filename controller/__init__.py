"""The adaptive speculation controller and the cost-per-token model (DESIGN §5). ``loop`` ticks every worker
through the stages of ``tick/`` (collect → decide → govern → push → report), then the fleet hooks
(``fleet_hooks``: gear modes → placement → cost attribution); one leader through the store."""
