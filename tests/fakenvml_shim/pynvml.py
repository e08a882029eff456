"""`import pynvml` in a child process gives the fake node named by TRAINBOX_FAKE_NVML (tests only).

Put this directory first on PYTHONPATH. The real pynvml is imported first (fakenvml copies its
constants and error classes), then this module's entry in sys.modules becomes the fake.
"""

import importlib
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
sys.path.insert(0, os.path.dirname(_here))  # tests/, for fakenvml
del sys.modules["pynvml"]
importlib.import_module("pynvml")  # the real one, for fakenvml's `import pynvml as real`

import fakenvml  # noqa: E402

_node = getattr(fakenvml, os.environ["TRAINBOX_FAKE_NVML"])()
os.cpu_count = lambda: _node.cpu_count  # NVML affinity masks are sized from it
sys.modules["pynvml"] = fakenvml.fake_pynvml(_node)
