"""Fleet control: shared provider limits and users' daily budgets, applied by admission (docs/fleet.md)."""
