"""Downloads its data while being imported (like a data-preparation script): testgen must not let it."""

import urllib.request

import torch
import torch_xla  # noqa: F401

urllib.request.urlopen("http://192.0.2.1/data.txt", timeout=5)  # TEST-NET-1: never a real host


def normalize(x):
    x = torch.as_tensor(x)
    return (x - x.mean()) / x.std()
