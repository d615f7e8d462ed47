"""Loads a script of dev/bench (which is not a package) as a module, for the Python tests."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_dev_bench_module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "dev", "bench", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
