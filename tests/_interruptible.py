"""A command line for a pytest that a test interrupts with SIGINT."""

import sys

#: ``python -m pytest`` with Python's Ctrl-C handler: a child of a script's background job (and of
#: nohup, some CI runners) inherits SIGINT ignored, Python leaves it so, and the SIGINT a test sends
#: would then do nothing.
PYTEST = [sys.executable, "-c", "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "runpy.run_module('pytest', run_name='__main__', alter_sys=True)"]
