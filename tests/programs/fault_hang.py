"""Planted fault: the script never finishes (what a collective waiting for a missing replica looks like)."""

import time

time.sleep(120)
