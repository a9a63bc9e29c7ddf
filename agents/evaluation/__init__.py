"""Comparing decision makers on one step at one or more budgets (``kdvfs compare``), with the
trade-off plot."""
