"""Installed into the bench environment (a .pth line imports it): torchvision's dataset classes check each file's
md5 against the real data set, and a synthetic stand-in (bench/unseen_data.py) can never match, so CIFAR-style
loaders would try to download and fail offline. This hook wraps `torchvision.datasets.utils.check_integrity` when
that module is first imported: a file in a folder that carries bench/unseen_data.py's mark counts as intact when
it exists. Every other file is checked as before. Only the bench environment loads this; never the product.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "torchvision.datasets.utils"
MARK = ".xlaport-synthetic"  # bench/unseen_data.SYNTHETIC_MARK


def trusting(original):
    def check_integrity(fpath, md5=None):
        folder = os.path.dirname(os.fspath(fpath))
        if os.path.isfile(os.path.join(folder, MARK)):
            return os.path.isfile(fpath)
        return original(fpath, md5)

    return check_integrity


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        module.check_integrity = trusting(module.check_integrity)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
