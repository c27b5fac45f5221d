"""The run's memory plan, added up from the model's config before any weights load (plan.py)."""
