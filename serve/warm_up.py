"""Imported only by the worker processes' forkserver (serve/isolated.py preloads it): one fix of a small script
there, so that every worker forked from it starts with the rules' first-call set-up done."""

from xlaport.kb import fix_source

from .isolated import WARM_UP_SOURCE

fix_source(WARM_UP_SOURCE, "warm_up.py")
