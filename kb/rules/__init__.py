"""The rule modules, by category of the study's taxonomy (c1..c7) and family; kb/registry.py lists them."""
