"""Rules of this category (see kb.rule.CATEGORY_NAMES)."""
